// SPDX-License-Identifier: Apache-2.0

// The transport's test program, one rank per process, driven by
// mooncake_test.go:
//
//   pxn_transport_test relay    rank 1 on rail1: relays, then obeys commands
//                               on stdin (hold, release, fail, check, ...)
//   pxn_transport_test sender   rank 0 on rail0: runs the cases through the
//                               patched MultiTransport; asks the relay for
//                               things with "RELAY <command>" lines
//   pxn_transport_test off      MC_PXN_ENABLE unset: the factory and the
//                               transport against RdmaTransport
//   pxn_transport_test pair     runs relay and sender and carries their
//                               lines (where mooncake_test.go cannot run)
//   pxn_transport_test bench    runs relay and bench-sender: 10 KiB, 8 MiB
//                               and 40 MiB writes through the relay, one
//                               "BENCH ..." line each (MC_PXN_SUBMIT_PIECE
//                               picks the relay's second-hop path)
//
// Each case prints "PASS <name>" or "FAIL <name>: <why>"; the program ends
// with "DONE". Targets are files in $SEAM_DIR mapped by both ranks, so the
// bytes one rank's relay writes are the bytes the other rank checks.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "config.h"
#include "multi_transport.h"
#include "pxn.h"
#include "pxn_rdma_transport.h"
#include "seam.h"

using namespace mooncake;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kTargetLen = 64ull << 20;
constexpr uint64_t kSrcLen = 48ull << 20;
constexpr uint64_t kHostLen = 4ull << 20;
constexpr SegmentID kDecode0 = 100;  // served by mlx5_0, rail0
constexpr SegmentID kDecode1 = 101;  // served by mlx5_1, rail1
constexpr uint64_t kBase0 = 0x7e0000000000ull;
constexpr uint64_t kBase1 = 0x7e1000000000ull;
constexpr uint32_t kRkey0 = 0xa000;
constexpr uint32_t kRkey1 = 0xb001;

struct CaseFailed {
    std::string why;
};

#define EXPECT(cond, msg)                                           \
    do {                                                            \
        if (!(cond)) {                                              \
            std::ostringstream os_;                                 \
            os_ << msg << " [" #cond "]";                           \
            throw CaseFailed{os_.str()};                            \
        }                                                           \
    } while (0)

std::string env(const char *name) {
    const char *v = std::getenv(name);
    return v ? v : "";
}

void *mapFile(const std::string &path, size_t len) {
    int fd = open(path.c_str(), O_RDWR);
    if (fd < 0) throw CaseFailed{"open " + path + ": " + strerror(errno)};
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) throw CaseFailed{"mmap " + path};
    return p;
}

// A decode segment of two GPUs, each with its own NIC: the buffer is on the
// GPU of the NIC named first.
std::shared_ptr<TransferMetadata::SegmentDesc> decodeSegment(
    const std::string &name, uint64_t base, const std::string &nic,
    std::vector<uint32_t> rkeys) {
    auto d = std::make_shared<TransferMetadata::SegmentDesc>();
    d->name = name;
    d->protocol = "rdma";
    std::string other = nic == "mlx5_0" ? "mlx5_1" : "mlx5_0";
    d->topology.parse("{\"cpu:0\": [[\"mlx5_0\"], [\"mlx5_1\"]], \"cuda:0\": [[\"" +
                      nic + "\"], [\"" + other + "\"]]}");
    // The devices in the topology's HCA order, as Mooncake publishes them.
    for (const char *dev : {"mlx5_0", "mlx5_1"}) {
        TransferMetadata::DeviceDesc dd;
        dd.name = dev;
        dd.lid = 0;
        d->devices.push_back(dd);
    }
    TransferMetadata::BufferDesc b;
    b.name = "cuda:0";
    b.addr = base;
    b.length = kTargetLen;
    b.lkey = {1, 2};
    b.rkey = rkeys;
    d->buffers.push_back(b);
    return d;
}

uint8_t pattern(uint64_t i, uint32_t seed) {
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    return static_cast<uint8_t>(x >> 29);
}

void fill(char *p, uint64_t len, uint32_t seed) {
    for (uint64_t i = 0; i < len; i++) p[i] = static_cast<char>(pattern(i, seed));
}

bool holds(const char *p, uint64_t len, uint32_t seed) {
    for (uint64_t i = 0; i < len; i++)
        if (static_cast<uint8_t>(p[i]) != pattern(i, seed)) return false;
    return true;
}

// Where libcuda.so.1 loads and reports a GPU (or PXN_TEST_CUDA=1 demands
// one), the "GPU" memory is real device memory (cuMemAlloc on GPU 0 for the
// sender, on GPU 1 for the relay when there are two), libpxn's default
// copier is its CUDA one, and the emulated NIC copies with cuMemcpy.
struct Cuda {
    using CUresult = int;
    using CUdeviceptr = unsigned long long;
    bool on = false;
    void *ctx = nullptr;
    CUresult (*init)(unsigned) = nullptr;
    CUresult (*deviceGetCount)(int *) = nullptr;
    CUresult (*deviceGet)(int *, int) = nullptr;
    CUresult (*primaryCtxRetain)(void **, int) = nullptr;
    CUresult (*ctxSetCurrent)(void *) = nullptr;
    CUresult (*memAlloc)(CUdeviceptr *, size_t) = nullptr;
    CUresult (*memcpy)(CUdeviceptr, CUdeviceptr, size_t) = nullptr;

    template <typename F>
    void sym(void *lib, const char *name, F &out) {
        out = reinterpret_cast<F>(dlsym(lib, name));
        if (!out) throw CaseFailed{std::string("libcuda.so.1 lacks ") + name};
    }

    void open(int rank) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!lib) throw CaseFailed{std::string("PXN_TEST_CUDA=1: ") + dlerror()};
        sym(lib, "cuInit", init);
        sym(lib, "cuDeviceGetCount", deviceGetCount);
        sym(lib, "cuDeviceGet", deviceGet);
        sym(lib, "cuDevicePrimaryCtxRetain", primaryCtxRetain);
        sym(lib, "cuCtxSetCurrent", ctxSetCurrent);
        sym(lib, "cuMemAlloc_v2", memAlloc);
        sym(lib, "cuMemcpy", memcpy);
        int n = 0, dev = 0;
        check(init(0), "cuInit");
        check(deviceGetCount(&n), "cuDeviceGetCount");
        check(deviceGet(&dev, n > 1 ? rank : 0), "cuDeviceGet");
        check(primaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
        check(ctxSetCurrent(ctx), "cuCtxSetCurrent");
        on = true;
    }

    // Whether to run on a GPU: PXN_TEST_CUDA=1 requires one; otherwise any
    // GPU the driver reports, as libpxn's default copier would take it.
    bool wanted() {
        if (env("PXN_TEST_CUDA") == "1") return true;
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!lib) return false;
        auto initf = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(lib, "cuInit"));
        auto countf = reinterpret_cast<CUresult (*)(int *)>(dlsym(lib, "cuDeviceGetCount"));
        int n = 0;
        return initf && countf && initf(0) == 0 && countf(&n) == 0 && n > 0;
    }

    static void check(CUresult rc, const char *what) {
        if (rc != 0)
            throw CaseFailed{std::string(what) + " failed: CUresult " +
                             std::to_string(rc)};
    }

    char *alloc(size_t n) {
        CUdeviceptr p = 0;
        check(memAlloc(&p, n), "cuMemAlloc");
        return reinterpret_cast<char *>(p);
    }

    int copy(void *dst, const void *src, size_t n) {
        if (ctxSetCurrent(ctx) != 0) return -1;
        return memcpy(reinterpret_cast<CUdeviceptr>(dst),
                      reinterpret_cast<CUdeviceptr>(src), n);
    }
};

Cuda cuda;

int cudaCopy(void *dst, const void *src, size_t n) {
    return cuda.copy(dst, src, n);
}

// Fills or checks len bytes at p, which may be device memory.
void fillAny(char *p, uint64_t len, uint32_t seed) {
    if (!cuda.on) return fill(p, len, seed);
    std::vector<char> tmp(len);
    fill(tmp.data(), len, seed);
    Cuda::check(cuda.copy(p, tmp.data(), len), "cuMemcpy to the source");
}

bool holdsAny(const char *p, uint64_t len, uint32_t seed) {
    if (!cuda.on) return holds(p, len, seed);
    std::vector<char> tmp(len);
    Cuda::check(cuda.copy(tmp.data(), p, len), "cuMemcpy from the source");
    return holds(tmp.data(), len, seed);
}

struct FreeBytes {
    void operator()(char *p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<char, FreeBytes>;

HostBuffer hostBuffer(size_t n) {
    return HostBuffer(static_cast<char *>(aligned_alloc(4096, n)));
}

struct Rank {
    int rank;
    // Outlive mt, whose transports have them registered.
    HostBuffer deviceMem, hostMem;
    std::shared_ptr<TransferMetadata> meta;
    std::shared_ptr<Topology> topo;
    std::unique_ptr<MultiTransport> mt;
    RdmaTransport *rdma = nullptr;
    PxnRdmaTransport *pxn = nullptr;
    char *device = nullptr;  // "GPU" memory: registered as cuda:0
    char *host = nullptr;
    char *decode[2] = {nullptr, nullptr};
    std::string name;
};

std::shared_ptr<Topology> localTopology(int rank) {
    auto t = std::make_shared<Topology>();
    std::string nic = "mlx5_" + std::to_string(rank);
    t->parse("{\"cpu:0\": [[\"" + nic + "\"], []], \"cuda:0\": [[\"" + nic +
             "\"], []]}");
    return t;
}

void addDecodeSegments(Rank &r) {
    // The topologies list mlx5_0 first, so decode1's key is its second.
    auto d0 = decodeSegment("decode0", kBase0, "mlx5_0", {kRkey0, 0xa001});
    auto d1 = decodeSegment("decode1", kBase1, "mlx5_1", {0xb000, kRkey1});
    r.meta->addLocalSegment(kDecode0, "decode0", std::move(d0));
    r.meta->addLocalSegment(kDecode1, "decode1", std::move(d1));
    std::string dir = env("SEAM_DIR");
    r.decode[0] = static_cast<char *>(mapFile(dir + "/decode0", kTargetLen));
    r.decode[1] = static_cast<char *>(mapFile(dir + "/decode1", kTargetLen));
    seam::mapTarget(kDecode0, kBase0, r.decode[0], kTargetLen);
    seam::mapTarget(kDecode1, kBase1, r.decode[1], kTargetLen);
}

void setUp(Rank &r, int rank) {
    r.rank = rank;
    r.name = "prefill" + std::to_string(rank);
    r.meta = std::make_shared<TransferMetadata>("P2PHANDSHAKE");
    r.topo = localTopology(rank);
    addDecodeSegments(r);
    // libpxn takes the GPU current at pxn_open, inside installTransport.
    if (cuda.wanted()) {
        cuda.open(rank);
        seam::setCopy(&cudaCopy);
    }
    r.mt = std::make_unique<MultiTransport>(r.meta, r.name);
    Transport *t = r.mt->installTransport("rdma", r.topo);
    if (t == nullptr) throw CaseFailed{"installTransport(rdma) failed"};
    r.rdma = dynamic_cast<RdmaTransport *>(t);
    r.pxn = dynamic_cast<PxnRdmaTransport *>(t);
    if (cuda.on)
        r.device = cuda.alloc(kSrcLen);
    else
        r.device = (r.deviceMem = hostBuffer(kSrcLen)).get();
    r.host = (r.hostMem = hostBuffer(kHostLen)).get();
    if (r.rdma->registerLocalMemory(r.device, kSrcLen, "cuda:0", true, true) ||
        r.rdma->registerLocalMemory(r.host, kHostLen, "cpu:0", true, true))
        throw CaseFailed{"registerLocalMemory failed"};
}

TransferRequest write(void *src, SegmentID target, uint64_t dst, size_t len) {
    TransferRequest r;
    r.opcode = TransferRequest::WRITE;
    r.source = src;
    r.target_id = target;
    r.target_offset = dst;
    r.length = len;
    return r;
}

bool isFinal(TransferStatusEnum s) {
    return s == TransferStatusEnum::COMPLETED ||
           s == TransferStatusEnum::FAILED || s == TransferStatusEnum::TIMEOUT;
}

// Polls every task of batch through MultiTransport until all are final.
std::vector<TransferStatus> await(MultiTransport &mt, BatchID b, size_t n,
                                  double seconds = 20) {
    auto end = Clock::now() + std::chrono::duration<double>(seconds);
    std::vector<TransferStatus> st(n);
    std::vector<bool> done(n, false);
    size_t left = n;
    while (left > 0) {
        for (size_t i = 0; i < n; i++) {
            if (done[i]) continue;
            Status s = mt.getTransferStatus(b, i, st[i]);
            EXPECT(s.ok(), "getTransferStatus(" << i << "): " << s.ToString());
            if (isFinal(st[i].s)) {
                done[i] = true;
                left--;
            }
        }
        EXPECT(left == 0 || Clock::now() < end,
               left << " of " << n << " tasks unfinished after " << seconds
                    << " s");
        if (left) std::this_thread::yield();
    }
    return st;
}

template <typename F>
void until(F pred, const std::string &what, double seconds = 20) {
    auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (!pred()) {
        EXPECT(Clock::now() < end, "timed out waiting for " << what);
        std::this_thread::yield();
    }
}

std::string relay(const std::string &cmd) {
    std::cout << "RELAY " << cmd << std::endl;
    std::string reply;
    if (!std::getline(std::cin, reply)) throw CaseFailed{"no reply to " + cmd};
    return reply;
}

void relayOK(const std::string &cmd) {
    std::string r = relay(cmd);
    EXPECT(r.rfind("OK", 0) == 0, "relay " << cmd << ": " << r);
}

// Posts since from for task; a freed batch's tasks may share an address
// with a later one's.
size_t postsOf(const std::vector<seam::Post> &posts, size_t from,
               const void *task) {
    size_t n = 0;
    for (size_t i = from; i < posts.size(); i++)
        if (posts[i].task == task) n++;
    return n;
}

struct Submitted {
    BatchID batch;
    size_t n;
};

Submitted submit(MultiTransport &mt, const std::vector<TransferRequest> &reqs) {
    BatchID b = mt.allocateBatchID(reqs.size());
    Status s = mt.submitTransfer(b, reqs);
    EXPECT(s.ok(), "submitTransfer: " << s.ToString());
    return {b, reqs.size()};
}

void freeBatch(MultiTransport &mt, BatchID b) {
    Status s = mt.freeBatchID(b);
    EXPECT(s.ok(), "freeBatchID: " << s.ToString());
}

void completedAll(const std::vector<TransferStatus> &st,
                  const std::vector<TransferRequest> &reqs) {
    for (size_t i = 0; i < st.size(); i++) {
        EXPECT(st[i].s == TransferStatusEnum::COMPLETED,
               "task " << i << " state " << st[i].s);
        EXPECT(st[i].transferred_bytes == reqs[i].length,
               "task " << i << " transferred " << st[i].transferred_bytes
                       << " of " << reqs[i].length);
    }
}

// What the relay's seam and transport counted (its "stats" command).
struct RelayStats {
    uint64_t pieces = 0, forwarded = 0, route_misses = 0, route_drops = 0;
    uint64_t allocate_batch = 0, segment_lookups = 0, select_device = 0;
    uint64_t allocations = 0, prepared_calls = 0, prepared_slices = 0;
    uint64_t slots = 0, slices = 0;

    RelayStats operator-(const RelayStats &o) const {
        RelayStats d;
        d.pieces = pieces - o.pieces;
        d.forwarded = forwarded - o.forwarded;
        d.route_misses = route_misses - o.route_misses;
        d.route_drops = route_drops - o.route_drops;
        d.allocate_batch = allocate_batch - o.allocate_batch;
        d.segment_lookups = segment_lookups - o.segment_lookups;
        d.select_device = select_device - o.select_device;
        d.allocations = allocations - o.allocations;
        d.prepared_calls = prepared_calls - o.prepared_calls;
        d.prepared_slices = prepared_slices - o.prepared_slices;
        d.slots = slots - o.slots;
        d.slices = slices - o.slices;
        return d;
    }

    std::string str() const {
        std::ostringstream os;
        os << "pieces " << pieces << ", forwarded " << forwarded
           << ", route misses " << route_misses << ", route drops "
           << route_drops << ", allocateBatchID " << allocate_batch
           << ", getSegmentDescByID " << segment_lookups << ", selectDevice "
           << select_device << ", heap allocations " << allocations
           << ", prepared calls " << prepared_calls << " (" << prepared_slices
           << " slices), pool growth " << slots << " slots, " << slices
           << " slot grows";
        return os.str();
    }
};

std::string formatStats(PxnRdmaTransport &t) {
    auto st = t.pxnStats();
    auto c = seam::counts();
    std::ostringstream os;
    os << "OK " << st.pieces << " " << st.forwarded_pieces << " "
       << st.route_misses << " " << st.route_drops << " " << c.allocate_batch
       << " " << c.segment_lookups << " " << c.select_device << " "
       << c.allocations << " " << c.prepared_calls << " " << c.prepared_slices
       << " " << st.piece_slots << " " << st.piece_slot_grows;
    return os.str();
}

RelayStats relayStats() {
    std::string reply = relay("stats");
    std::istringstream in(reply);
    std::string ok;
    RelayStats r;
    in >> ok >> r.pieces >> r.forwarded >> r.route_misses >> r.route_drops >>
        r.allocate_batch >> r.segment_lookups >> r.select_device >>
        r.allocations >> r.prepared_calls >> r.prepared_slices >> r.slots >>
        r.slices;
    EXPECT(ok == "OK" && !in.fail(), "relay stats: " << reply);
    return r;
}

// Sender cases. Each writes its own region of the decode buffers.

struct Sender {
    Rank &r;
    uint32_t seed = 1;

    char *decodeAt(SegmentID seg, uint64_t off) {
        return r.decode[seg == kDecode0 ? 0 : 1] + off;
    }
    uint64_t base(SegmentID seg) { return seg == kDecode0 ? kBase0 : kBase1; }

    // Writes len bytes from device+src_off to seg+off; returns the request.
    TransferRequest prep(char *mem, uint64_t src_off, SegmentID seg,
                         uint64_t off, uint64_t len) {
        fillAny(mem + src_off, len, seed);
        std::memset(decodeAt(seg, off), 0, len);
        return write(mem + src_off, seg, base(seg) + off, len);
    }

    void checkBytes(SegmentID seg, uint64_t off, uint64_t len, uint32_t s) {
        EXPECT(holds(decodeAt(seg, off), len, s),
               "bytes at decode" << (seg == kDecode0 ? 0 : 1) << "+" << off
                                 << " differ");
    }

    // A write the base must carry itself: posted for the very task
    // MultiTransport built, and nothing through libpxn.
    void direct(char *mem, SegmentID seg, uint64_t off, uint64_t len,
                const char *what) {
        auto before = r.pxn->pxnStats();
        seed++;
        std::vector<TransferRequest> reqs = {prep(mem, 0, seg, off, len)};
        size_t posts0 = seam::posts().size();
        auto sub = submit(*r.mt, reqs);
        auto &task = Transport::toBatchDesc(sub.batch).task_list[0];
        EXPECT(postsOf(seam::posts(), posts0, &task) == (len + 65535) / 65536,
               what << ": RdmaTransport did not get the task itself");
        auto st = await(*r.mt, sub.batch, 1);
        completedAll(st, reqs);
        checkBytes(seg, off, len, seed);
        auto after = r.pxn->pxnStats();
        EXPECT(after.direct_bytes == before.direct_bytes &&
                   after.relayed_bytes == before.relayed_bytes,
               what << ": libpxn saw the write");
        freeBatch(*r.mt, sub.batch);
    }

    void sameRail() { direct(r.device, kDecode0, 0, 1 << 20, "same rail"); }

    void hostSource() { direct(r.host, kDecode1, 0, 1 << 20, "host source"); }

    void read() {
        fillAny(r.device, 1 << 16, 78);
        fill(decodeAt(kDecode1, 1 << 20), 1 << 16, 77);
        TransferRequest q = write(r.device, kDecode1, kBase1 + (1 << 20), 1 << 16);
        q.opcode = TransferRequest::READ;
        size_t posts0 = seam::posts().size();
        auto sub = submit(*r.mt, {q});
        auto &task = Transport::toBatchDesc(sub.batch).task_list[0];
        EXPECT(postsOf(seam::posts(), posts0, &task) == 1,
               "read not posted by the base");
        auto st = await(*r.mt, sub.batch, 1);
        EXPECT(st[0].s == TransferStatusEnum::COMPLETED, "read state " << st[0].s);
        EXPECT(holdsAny(r.device, 1 << 16, 77), "read bytes differ");
        freeBatch(*r.mt, sub.batch);
    }

    void waitRelay() {
        EXPECT(r.pxn->pxnWaitRelay("rail1", 10000), "no relay on rail1");
    }

    // Cross-rail writes from device memory: staged, relayed, the relay's
    // second hop posted with the arena's key and the route's remote key.
    void crossRail() {
        waitRelay();
        relayOK("clear");
        seed++;
        auto before = r.pxn->pxnStats();
        size_t posts0 = seam::posts().size();
        std::vector<TransferRequest> reqs;
        reqs.push_back(prep(r.device, 0, kDecode1, 2 << 20, 10 << 10));
        reqs.push_back(prep(r.device, 1 << 20, kDecode1, 4 << 20, (8 << 20) + 1));
        for (uint64_t i = 0; i < 64; i++)
            reqs.push_back(prep(r.device, (16 << 20) + i * (48 << 10), kDecode1,
                                (16 << 20) + i * (32 << 10), 16 << 10));
        uint64_t total = 0;
        for (auto &q : reqs) total += q.length;
        auto sub = submit(*r.mt, reqs);
        auto st = await(*r.mt, sub.batch, reqs.size());
        completedAll(st, reqs);
        EXPECT(seam::posts().size() == posts0,
               "the sender's RdmaTransport posted relayed writes");
        checkBytes(kDecode1, 2 << 20, 10 << 10, seed);
        checkBytes(kDecode1, 4 << 20, (8 << 20) + 1, seed);
        for (uint64_t i = 0; i < 64; i++)
            checkBytes(kDecode1, (16 << 20) + i * (32 << 10), 16 << 10, seed);
        auto after = r.pxn->pxnStats();
        EXPECT(after.relayed_bytes - before.relayed_bytes == total,
               "relayed " << after.relayed_bytes - before.relayed_bytes
                          << " of " << total);
        EXPECT(after.fallback_bytes == before.fallback_bytes, "fallbacks");
        freeBatch(*r.mt, sub.batch);
        relayOK("check " + std::to_string(kDecode1) + " " +
                std::to_string(kRkey1) + " " + std::to_string(total));
        after = r.pxn->pxnStats();
        EXPECT(after.tasks == 0 && after.pxn_batches == 0,
               "left: " << after.tasks << " tasks, " << after.pxn_batches
                        << " libpxn batches");
    }

    // WAITING while unfinished, transferred_bytes growing Piece by Piece,
    // then COMPLETED; and MultiTransport's slice timeout on a WAITING task.
    void statusAndProgress() {
        waitRelay();
        seed++;
        relayOK("hold");
        uint64_t len = 24ull << 20;
        std::vector<TransferRequest> reqs = {prep(r.device, 0, kDecode1, 0, len)};
        auto sub = submit(*r.mt, reqs);
        until([&] { return relay("held") == "OK 3"; }, "3 Pieces held by the relay's NIC");
        TransferStatus st;
        r.mt->getTransferStatus(sub.batch, 0, st);
        EXPECT(st.s == TransferStatusEnum::WAITING && st.transferred_bytes == 0,
               "held: state " << st.s << " transferred " << st.transferred_bytes);
        TransferStatus bs;
        r.mt->getBatchTransferStatus(sub.batch, bs);
        EXPECT(bs.s == TransferStatusEnum::WAITING, "batch state " << bs.s);
        relayOK("release 1");
        until([&] {
            r.mt->getTransferStatus(sub.batch, 0, st);
            return st.transferred_bytes > 0;
        }, "the first Piece to count");
        EXPECT(st.s == TransferStatusEnum::WAITING &&
                   st.transferred_bytes == (8ull << 20),
               "one Piece done: state " << st.s << " transferred "
                                        << st.transferred_bytes);
        relayOK("release 0");
        auto fin = await(*r.mt, sub.batch, 1);
        completedAll(fin, reqs);
        r.mt->getBatchTransferStatus(sub.batch, bs);
#ifdef USE_EVENT_DRIVEN_COMPLETION
        // Event-driven completion finishes a batch without recording its
        // bytes (finished_transfer_bytes), for every transport.
        EXPECT(bs.s == TransferStatusEnum::COMPLETED, "batch state " << bs.s);
#else
        EXPECT(bs.s == TransferStatusEnum::COMPLETED && bs.transferred_bytes == len,
               "batch state " << bs.s << " transferred " << bs.transferred_bytes);
#endif
        checkBytes(kDecode1, 0, len, seed);
        freeBatch(*r.mt, sub.batch);

        // MultiTransport turns a WAITING task whose slice is older than
        // slice_timeout into TIMEOUT; the task stays the transport's until
        // it ends.
        seed++;
        relayOK("hold");
        reqs = {prep(r.device, 0, kDecode1, 0, 1 << 20)};
        sub = submit(*r.mt, reqs);
        globalConfig().slice_timeout = 1;
        until([&] {
            r.mt->getTransferStatus(sub.batch, 0, st);
            return st.s != TransferStatusEnum::WAITING;
        }, "MultiTransport's slice timeout", 10);
        globalConfig().slice_timeout = -1;
        EXPECT(st.s == TransferStatusEnum::TIMEOUT, "state " << st.s);
        EXPECT(!r.mt->freeBatchID(sub.batch).ok(),
               "a batch with a task in flight was freed");
        relayOK("release 0");
        fin = await(*r.mt, sub.batch, 1);
        completedAll(fin, reqs);
        freeBatch(*r.mt, sub.batch);
    }

    // One round of the steady-state shape: two 8 MiB writes and 32 of
    // 16 KiB, apart, in one batch; their bytes checked.
    void pieceRound() {
        seed++;
        std::vector<TransferRequest> reqs;
        for (uint64_t i = 0; i < 2; i++)
            reqs.push_back(prep(r.device, i * (8 << 20), kDecode1,
                                (20 << 20) + i * (8 << 20), 8 << 20));
        for (uint64_t i = 0; i < 32; i++)
            reqs.push_back(prep(r.device, (16 << 20) + i * (32 << 10), kDecode1,
                                (40 << 20) + i * (32 << 10), 16 << 10));
        auto sub = submit(*r.mt, reqs);
        completedAll(await(*r.mt, sub.batch, reqs.size()), reqs);
        for (const auto &q : reqs)
            checkBytes(kDecode1, q.target_offset - kBase1, q.length, seed);
        freeBatch(*r.mt, sub.batch);
    }

    // Relayed Pieces in the steady state (no slot or slice added to the
    // pool, every route cached) cost the relay's transport no batch, no
    // segment lookup, no device selection and no heap allocation: each goes
    // whole through one submitPreparedSlices. Rounds are measured one by
    // one until one is steady; a route refreshed for its age or a pool that
    // grew makes a round unsteady, and lookups and batches are made only
    // then. No steady round in twenty fails.
    void pieceSteadyState() {
        waitRelay();
        pieceRound();
        pieceRound();
        std::string last;
        for (int round = 0; round < 20; round++) {
            auto before = relayStats();
            pieceRound();
            auto d = relayStats() - before;
            last = d.str();
            EXPECT(d.forwarded >= 3, "a round forwarded " << d.forwarded
                                                          << " Pieces: " << last);
            EXPECT(d.pieces == d.forwarded,
                   "Pieces through submit_piece " << d.pieces << " of "
                                                  << d.forwarded << ": " << last);
            EXPECT(d.prepared_calls == d.pieces,
                   "one submitPreparedSlices per Piece: " << last);
            EXPECT(d.prepared_slices >= (16 << 20) >> 16,
                   "16 MiB in at most 64 KiB slices: " << last);
            EXPECT(d.select_device == 0, "selectDevice per Piece: " << last);
            EXPECT(d.allocate_batch == d.slots,
                   "allocateBatchID beyond the pool's growth: " << last);
            EXPECT(d.segment_lookups == d.route_misses,
                   "getSegmentDescByID beyond the route cache's misses: " << last);
            if (d.route_misses != 0 || d.slots != 0 || d.slices != 0) continue;
            EXPECT(d.allocate_batch == 0, "allocateBatchID per Piece: " << last);
            EXPECT(d.segment_lookups == 0, "getSegmentDescByID per Piece: " << last);
            EXPECT(d.allocations == 0, "heap allocations per Piece: " << last);
            EXPECT(d.route_drops == 0, "routes dropped: " << last);
            return;
        }
        EXPECT(false, "no steady round in 20; the last: " << last);
    }

    // The target's buffer gets a new remote key (registered again). The
    // first write after it fails (the NIC refuses the cached key, or the
    // transport finds the key changed and fails the Piece as stale), which
    // drops the route in libpxn and in the transport; the next write looks
    // the target up again and lands with the new key.
    void routeRekeyed() {
        waitRelay();
        const uint32_t fresh = 0xb777;
        auto before = relayStats();
        relayOK("rekey " + std::to_string(kDecode1) + " " + std::to_string(fresh));
        seed++;
        std::vector<TransferRequest> reqs = {prep(r.device, 0, kDecode1, 12 << 20, 1 << 20)};
        auto sub = submit(*r.mt, reqs);
        auto st = await(*r.mt, sub.batch, 1);
        EXPECT(st[0].s == TransferStatusEnum::FAILED,
               "a write with the old key: state " << st[0].s);
        freeBatch(*r.mt, sub.batch);
        auto failed = relayStats() - before;
        EXPECT(failed.route_drops >= 1 || failed.route_misses >= 1,
               "the old route was neither dropped nor looked up: " << failed.str());
        relayOK("clear");
        auto mid = relayStats();
        seed++;
        reqs = {prep(r.device, 0, kDecode1, 12 << 20, 1 << 20)};
        sub = submit(*r.mt, reqs);
        completedAll(await(*r.mt, sub.batch, 1), reqs);
        checkBytes(kDecode1, 12 << 20, 1 << 20, seed);
        freeBatch(*r.mt, sub.batch);
        auto d = relayStats() - mid;
        EXPECT(d.pieces >= 1 && d.route_misses >= 1 && d.segment_lookups >= 1,
               "the new key was not looked up: " << d.str());
        relayOK("check " + std::to_string(kDecode1) + " " + std::to_string(fresh) +
                " " + std::to_string(1 << 20));
    }

    // A relayed Piece whose slices the relay's NIC holds past the relay's
    // slice_timeout is reported timed out, which is not final: the relay
    // keeps the Piece's slot (op_batches), and the task stays unfinished,
    // while its NIC still holds the slices; once they finish the transport
    // reports the Piece again, the task ends TIMEOUT, the slot returns, and
    // the next write looks the route up again.
    void pieceTimeout() {
        waitRelay();
        seed++;
        auto before = relayStats();
        relayOK("hold");
        relayOK("timeout 1");
        std::vector<TransferRequest> reqs = {prep(r.device, 0, kDecode1, 10 << 20, 1 << 20)};
        auto sub = submit(*r.mt, reqs);
        std::string held;
        TransferStatus mid;
        try {
            until([&] { return (relayStats() - before).route_drops >= 1; },
                  "the relay's transport to report the held Piece timed out", 30);
            held = relay("opbatches");
            r.mt->getTransferStatus(sub.batch, 0, mid);
        } catch (...) {
            relay("timeout -1");
            relay("release 0");
            throw;
        }
        relayOK("timeout -1");
        relayOK("release 0");
        EXPECT(held != "OK 0" && held.rfind("OK", 0) == 0,
               "the relay kept no slot for the Piece its NIC holds: " << held);
        EXPECT(mid.s != TransferStatusEnum::COMPLETED && mid.s != TransferStatusEnum::FAILED,
               "the task ended (" << mid.s << ") while the relay's NIC still held its Piece");
        auto st = await(*r.mt, sub.batch, 1, 30);
        EXPECT(st[0].s == TransferStatusEnum::TIMEOUT, "state " << st[0].s);
        freeBatch(*r.mt, sub.batch);
        auto d = relayStats() - before;
        EXPECT(d.pieces >= 1 && d.route_drops >= 1,
               "the timed-out Piece left its route: " << d.str());
        seed++;
        reqs = {prep(r.device, 0, kDecode1, 10 << 20, 1 << 20)};
        sub = submit(*r.mt, reqs);
        completedAll(await(*r.mt, sub.batch, 1), reqs);
        checkBytes(kDecode1, 10 << 20, 1 << 20, seed);
        freeBatch(*r.mt, sub.batch);
        until([&] { return relay("opbatches") == "OK 0"; },
              "the timed-out Piece's slot to return", 20);
    }

    // A second hop that fails after the doorbell fails the task; it is not
    // replayed on the direct path.
    void secondHopFailure() {
        waitRelay();
        seed++;
        // A route the relay's transport holds: failing its slice drops it.
        pieceRound();
        auto relay0 = relayStats();
        auto before = r.pxn->pxnStats();
        size_t posts0 = seam::posts().size();
        relayOK("fail " + std::to_string(kDecode1));
        std::vector<TransferRequest> reqs = {prep(r.device, 0, kDecode1, 8 << 20, 1 << 20)};
        auto sub = submit(*r.mt, reqs);
        auto st = await(*r.mt, sub.batch, 1);
        relayOK("unfail " + std::to_string(kDecode1));
        auto dropped = relayStats() - relay0;
        EXPECT(dropped.pieces == 0 || dropped.route_drops >= 1,
               "a failed Piece left its route cached: " << dropped.str());
        EXPECT(st[0].s == TransferStatusEnum::FAILED, "state " << st[0].s);
        EXPECT(seam::posts().size() == posts0, "the failed write was replayed");
        auto after = r.pxn->pxnStats();
        EXPECT(after.fallback_bytes == before.fallback_bytes, "fallback after the doorbell");
        freeBatch(*r.mt, sub.batch);
        // The relay resolves the target again and the next write goes through.
        seed++;
        reqs = {prep(r.device, 0, kDecode1, 8 << 20, 1 << 20)};
        sub = submit(*r.mt, reqs);
        completedAll(await(*r.mt, sub.batch, 1), reqs);
        checkBytes(kDecode1, 8 << 20, 1 << 20, seed);
        freeBatch(*r.mt, sub.batch);
    }

    // Pieces that find no credit at a stalled relay go direct before their
    // doorbell, each exactly once; the published ones finish through the
    // relay once it moves again.
    void fallbackBeforeDoorbell() {
        waitRelay();
        seed++;
        auto before = r.pxn->pxnStats();
        size_t posts0 = seam::posts().size();
        relayOK("hold");
        const size_t n = 24;
        const uint64_t len = 64 << 10;
        std::vector<std::vector<TransferRequest>> reqs(n);
        std::vector<Submitted> subs;
        for (size_t i = 0; i < n; i++) {
            // Gaps between the writes, so that no two can travel as one op.
            reqs[i] = {prep(r.device, i * 2 * len, kDecode1,
                            (32 << 20) + i * 2 * len, len)};
            subs.push_back(submit(*r.mt, reqs[i]));
        }
        until([&] {
            return r.pxn->pxnStats().fallback_pieces > before.fallback_pieces;
        }, "a Piece to fall back");
        relayOK("release 0");
        for (size_t i = 0; i < n; i++)
            completedAll(await(*r.mt, subs[i].batch, 1), reqs[i]);
        size_t fell = 0;
        auto posts = seam::posts();
        for (size_t i = 0; i < n; i++) {
            uint64_t dst = reqs[i][0].target_offset;
            size_t k = 0;
            for (size_t j = posts0; j < posts.size(); j++)
                if (posts[j].dst <= dst &&
                    dst + len <= posts[j].dst + posts[j].length)
                    k++;
            EXPECT(k <= 1, "write " << i << " posted " << k << " times");
            fell += k;
            checkBytes(kDecode1, (32 << 20) + i * 2 * len, len, seed);
            freeBatch(*r.mt, subs[i].batch);
        }
        auto after = r.pxn->pxnStats();
        EXPECT(fell > 0 && fell < n, fell << " of " << n << " writes went direct");
        EXPECT(after.fallback_pieces - before.fallback_pieces == fell,
               "fallback pieces " << after.fallback_pieces - before.fallback_pieces
                                  << ", direct posts " << fell);
        EXPECT(after.relayed_pieces - before.relayed_pieces == n - fell,
               "relayed pieces " << after.relayed_pieces - before.relayed_pieces);
    }

    // A Piece that falls back to this rank's NIC, which holds it past
    // Mooncake's slice timeout, ends its task TIMEOUT through libpxn; the
    // task is finished, and in an event-driven build so is its batch.
    void timeoutEndsBatch() {
        waitRelay();
        seed++;
        auto before = r.pxn->pxnStats();
        relayOK("hold");
        seam::hold();
        globalConfig().slice_timeout = 1;
        const size_t n = 24;
        const uint64_t len = 64 << 10;
        std::vector<std::vector<TransferRequest>> reqs(n);
        std::vector<Submitted> subs;
        for (size_t i = 0; i < n; i++) {
            reqs[i] = {prep(r.device, i * 2 * len, kDecode1,
                            (32 << 20) + i * 2 * len, len)};
            subs.push_back(submit(*r.mt, reqs[i]));
        }
        size_t timedOut = n;
        try {
            until([&] {
                for (size_t i = 0; i < n; i++) {
                    TransferStatus st;
                    r.mt->getTransferStatus(subs[i].batch, 0, st);
                    auto &task = Transport::toBatchDesc(subs[i].batch).task_list[0];
                    if (st.s == TransferStatusEnum::TIMEOUT && task.is_finished) {
                        timedOut = i;
                        return true;
                    }
                }
                return false;
            }, "a fallen-back write to end TIMEOUT", 30);
        } catch (...) {
            globalConfig().slice_timeout = -1;
            seam::release(0);
            relay("release 0");
            throw;
        }
        globalConfig().slice_timeout = -1;
        auto after = r.pxn->pxnStats();
        EXPECT(after.fallback_pieces > before.fallback_pieces, "no Piece fell back");
#ifdef USE_EVENT_DRIVEN_COMPLETION
        auto &bd = Transport::toBatchDesc(subs[timedOut].batch);
        EXPECT(bd.is_finished.load() && bd.finished_task_count.load() == 1,
               "the TIMEOUT task's batch is not finished: is_finished "
                   << bd.is_finished.load() << ", finished tasks "
                   << bd.finished_task_count.load());
        EXPECT(bd.has_failure.load(), "the TIMEOUT task's batch records no failure");
#endif
        seam::release(0);
        relayOK("release 0");
        // The others finish, through the relay or direct; each batch is
        // freed once it has.
        for (size_t i = 0; i < n; i++) {
            if (i != timedOut) await(*r.mt, subs[i].batch, 1);
            until([&] { return r.mt->freeBatchID(subs[i].batch).ok(); },
                  "batch " + std::to_string(i) + " to be freed");
        }
    }

    // The relay closes while its NIC holds the second hop of a write
    // (closeHeld checks the relay); this rank's write then ends, whatever
    // its state. The relay is gone afterwards: this case runs last.
    void closeWhileHeld() {
        waitRelay();
        seed++;
        relayOK("hold");
        std::vector<TransferRequest> reqs = {prep(r.device, 0, kDecode1, 0, 8 << 20)};
        auto sub = submit(*r.mt, reqs);
        until([&] { return relay("held") != "OK 0"; }, "the relay's NIC to hold a write");
        relayOK("close");
        await(*r.mt, sub.batch, 1, 30);
        freeBatch(*r.mt, sub.batch);
    }

    // Every libpxn batch and every internal batch is freed once its tasks
    // are final, on both ranks.
    void batchesFreed() {
        waitRelay();
        for (int round = 0; round < 200; round++) {
            seed++;
            std::vector<TransferRequest> reqs;
            for (uint64_t i = 0; i < 4; i++)
                reqs.push_back(prep(r.device, i * (8 << 10), kDecode1,
                                    (48 << 20) + i * (4 << 10), 4 << 10));
            auto sub = submit(*r.mt, reqs);
            completedAll(await(*r.mt, sub.batch, reqs.size()), reqs);
            freeBatch(*r.mt, sub.batch);
        }
        auto st = r.pxn->pxnStats();
        EXPECT(st.tasks == 0 && st.pxn_batches == 0 && st.live_batches == 0 &&
                   st.op_batches == 0,
               "sender holds " << st.tasks << " tasks, " << st.pxn_batches
                               << " libpxn batches (" << st.live_batches
                               << " live in libpxn), " << st.op_batches
                               << " op batches");
        relayOK("freed");
    }
};

// PXN stayed off although asked for. A libpxn that takes the version 3
// options without handing over its arena predates API version 3's
// implementation: the cases cannot run against it.
int pxnOff(const PxnRdmaTransport &t, const char *who) {
    const std::string &why = t.pxnOffReason();
    if (why.find("did not offer its staging arena") != std::string::npos) {
        std::cout << "SKIP libpxn.so does not implement API version 3 yet ("
                  << why << ")" << std::endl;
        return 0;
    }
    std::cout << "FAIL setup: PXN is off in the " << who << ": " << why
              << std::endl;
    return 1;
}

int runSender() {
    Rank r;
    setUp(r, 0);
    if (r.pxn == nullptr) {
        std::cout << "FAIL setup: MC_PXN_ENABLE=1 and the factory did not "
                     "construct PxnRdmaTransport"
                  << std::endl;
        return 1;
    }
    if (!r.pxn->pxnStats().active) return pxnOff(*r.pxn, "sender");
    Sender s{r};
    std::vector<std::pair<std::string, std::function<void()>>> cases = {
        {"copier", [&] {
             uint64_t want = cuda.on ? PXN_COPIER_CUDA : PXN_COPIER_HOST;
             EXPECT(r.pxn->pxnStats().copier == want,
                    "copier " << r.pxn->pxnStats().copier << ", want " << want);
         }},
        {"same_rail", [&] { s.sameRail(); }},
        {"host_source", [&] { s.hostSource(); }},
        {"read", [&] { s.read(); }},
        {"cross_rail", [&] { s.crossRail(); }},
        {"status_and_progress", [&] { s.statusAndProgress(); }},
        {"piece_steady_state", [&] { s.pieceSteadyState(); }},
        {"route_rekeyed", [&] { s.routeRekeyed(); }},
        {"piece_timeout", [&] { s.pieceTimeout(); }},
        {"second_hop_failure", [&] { s.secondHopFailure(); }},
        {"fallback_before_doorbell", [&] { s.fallbackBeforeDoorbell(); }},
        {"batches_freed", [&] { s.batchesFreed(); }},
        {"timeout_ends_batch", [&] { s.timeoutEndsBatch(); }},
        {"close_while_held", [&] { s.closeWhileHeld(); }},
    };
    int failed = 0;
    for (auto &c : cases) {
        try {
            c.second();
            std::cout << "PASS " << c.first << std::endl;
        } catch (const CaseFailed &f) {
            std::cout << "FAIL " << c.first << ": " << f.why << std::endl;
            failed++;
        }
    }
    std::cout << "DONE" << std::endl;
    return failed ? 1 : 0;
}

// The benchmark's sender: per workload, writes of one size to decode1
// through the relay, batch by batch, timed from the first submit to the
// last completion; the relay's counts over the workload divided by the
// Pieces it forwarded. The last batch's bytes are checked.
int runBench() {
    Rank r;
    setUp(r, 0);
    if (r.pxn == nullptr || !r.pxn->pxnStats().active)
        return r.pxn ? pxnOff(*r.pxn, "bench sender") : 1;
    Sender s{r};
    s.waitRelay();
    struct Workload {
        const char *name;
        uint64_t len, stride, per_batch, batches;
    };
    const std::vector<Workload> loads = {
        {"10KiB", 10 << 10, 16 << 10, 64, 64},
        {"8MiB", 8 << 20, 8 << 20, 4, 16},
        {"5GiB", 40ull << 20, 0, 1, 128},
    };
    const char *path = std::getenv("MC_PXN_SUBMIT_PIECE");
    std::string mode = path && std::strcmp(path, "0") == 0 ? "per-op" : "piece";
    fill(r.device, kSrcLen, 91);
    int failed = 0;
    for (const auto &w : loads) {
        try {
            std::vector<TransferRequest> reqs;
            for (uint64_t i = 0; i < w.per_batch; i++)
                reqs.push_back(write(r.device + (w.stride ? i * w.stride : 0),
                                     kDecode1, kBase1 + i * w.stride, w.len));
            // Warm-up batches, as a serving process is warm.
            for (int k = 0; k < 3; k++) {
                auto warm = submit(*r.mt, reqs);
                completedAll(await(*r.mt, warm.batch, reqs.size(), 120), reqs);
                freeBatch(*r.mt, warm.batch);
            }
            std::memset(r.decode[1], 0, kTargetLen);
            auto before = relayStats();
            auto start = Clock::now();
            for (uint64_t b = 0; b < w.batches; b++) {
                auto sub = submit(*r.mt, reqs);
                completedAll(await(*r.mt, sub.batch, reqs.size(), 120), reqs);
                freeBatch(*r.mt, sub.batch);
            }
            double secs = std::chrono::duration<double>(Clock::now() - start).count();
            auto d = relayStats() - before;
            // Write i copied the source at i * stride to the same offset.
            for (uint64_t i = 0; i < w.per_batch; i++) {
                uint64_t at = i * w.stride;
                for (uint64_t j = 0; j < w.len; j++)
                    EXPECT(static_cast<uint8_t>(r.decode[1][at + j]) ==
                               pattern(at + j, 91),
                           "byte " << at + j << " of decode1 differs");
            }
            uint64_t writes = w.per_batch * w.batches;
            uint64_t bytes = writes * w.len;
            double pieces = d.forwarded ? double(d.forwarded) : 1;
            std::ostringstream os;
            os.setf(std::ios::fixed);
            os.precision(2);
            os << "BENCH " << mode << " " << w.name << " writes=" << writes
               << " bytes=" << bytes << " seconds=" << secs
               << " GBps=" << bytes / secs / 1e9
               << " us_per_write=" << secs * 1e6 / writes
               << " pieces=" << d.forwarded
               << " allocs_per_piece=" << d.allocations / pieces
               << " batch_ids_per_piece=" << d.allocate_batch / pieces
               << " lookups_per_piece=" << d.segment_lookups / pieces
               << " selects_per_piece=" << d.select_device / pieces;
            std::cout << os.str() << std::endl;
        } catch (const CaseFailed &f) {
            std::cout << "FAIL bench " << w.name << ": " << f.why << std::endl;
            failed++;
        }
    }
    std::cout << "DONE" << std::endl;
    return failed ? 1 : 0;
}

// Closes the relay's PXN side while its NIC holds second-hop writes from
// the arena: the arena must stay registered and mapped, the internal
// batches be kept, and be freed once the NIC has finished them.
std::string closeHeld(Rank &r) {
    std::ostringstream why;
    const seam::Registration *arena = nullptr;
    auto regs = seam::registrations();
    for (const auto &g : regs)
        if (g.live && !g.remote_accessible) arena = &g;
    if (arena == nullptr) return "FAIL no local-only registration (arena)";
    if (seam::held() == 0) return "FAIL the NIC holds nothing";
    r.pxn->pxnClose();
    auto st = r.pxn->pxnStats();
    if (st.active) why << "PXN still active after pxnClose; ";
    if (st.op_batches == 0) why << "no internal batch kept while the NIC holds writes; ";
    bool live = false;
    for (const auto &g : seam::registrations())
        if (g.addr == arena->addr && g.live) live = true;
    if (!live) why << "the arena was deregistered while the NIC held writes from it; ";
    long page = sysconf(_SC_PAGESIZE);
    void *at = reinterpret_cast<void *>(arena->addr & ~uint64_t(page - 1));
    if (msync(at, page, MS_ASYNC) != 0)
        why << "the arena is no longer mapped (" << std::strerror(errno) << "); ";
    // The NIC finishes, on its own thread; a later call frees what it kept.
    seam::release(0);
    auto end = Clock::now() + std::chrono::seconds(20);
    for (;;) {
        r.pxn->pxnClose();
        st = r.pxn->pxnStats();
        if (st.op_batches == 0 || Clock::now() > end) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (st.op_batches != 0)
        why << st.op_batches << " internal batches left 20 s after the NIC was released; ";
    return why.str().empty() ? "OK" : "FAIL " + why.str();
}

// The relay: its transport relays for rank 0; commands come on stdin.
int runRelay() {
    // This thread reads commands; what it allocates is not the relay's.
    seam::Quiet quiet;
    Rank r;
    setUp(r, 1);
    if (r.pxn == nullptr) {
        std::cout << "FAIL relay: the factory did not construct PxnRdmaTransport"
                  << std::endl;
        return 1;
    }
    if (!r.pxn->pxnStats().active) return pxnOff(*r.pxn, "relay");
    std::cout << "READY" << std::endl;
    size_t mark = 0;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd;
        in >> cmd;
        std::string reply = "OK";
        if (cmd == "quit") {
            break;
        } else if (cmd == "clear") {
            mark = seam::posts().size();
        } else if (cmd == "hold") {
            seam::hold();
        } else if (cmd == "release") {
            size_t n = 0;
            in >> n;
            seam::release(n);
        } else if (cmd == "held") {
            reply = "OK " + std::to_string(seam::held());
        } else if (cmd == "fail" || cmd == "unfail") {
            uint64_t seg = 0;
            in >> seg;
            seam::failTarget(seg, cmd == "fail");
        } else if (cmd == "check") {
            uint64_t seg = 0, rkey = 0, bytes = 0;
            in >> seg >> rkey >> bytes;
            // The arena is registered one lane at a time: local-only
            // registrations, one a lane.
            std::vector<const seam::Registration *> arena;
            auto regs = seam::registrations();
            for (const auto &g : regs)
                if (g.live && !g.remote_accessible) arena.push_back(&g);
            auto posts = seam::posts();
            uint64_t sum = 0;
            std::ostringstream why;
            if (arena.empty()) why << "no local-only registration (arena); ";
            for (const auto *a : arena)
                if (a->update_metadata) why << "the arena was published; ";
            for (size_t i = mark; i < posts.size() && !arena.empty(); i++) {
                const auto &p = posts[i];
                sum += p.length;
                const seam::Registration *lane = nullptr;
                for (const auto *a : arena)
                    if (p.source >= a->addr && p.source + p.length <= a->addr + a->length)
                        lane = a;
                if (lane == nullptr)
                    why << "post " << i << " not from one lane of the arena; ";
                else if (p.lkey != lane->lkey)
                    why << "post " << i << " lkey " << p.lkey << " != its lane's "
                        << lane->lkey << "; ";
                if (p.rkey != rkey || p.target_id != seg)
                    why << "post " << i << " to " << p.target_id << " rkey "
                        << p.rkey << "; ";
                if (p.opcode != TransferRequest::WRITE)
                    why << "post " << i << " not a write; ";
                // A slice the Piece path prepared names the target's NIC:
                // Mooncake's segment name, '@', the device.
                std::string path = seg == kDecode0 ? "decode0@mlx5_0" : "decode1@mlx5_1";
                if (p.prepared && p.peer_nic_path != path)
                    why << "post " << i << " to peer NIC path " << p.peer_nic_path << "; ";
            }
            if (sum != bytes) why << "posted " << sum << " of " << bytes << " bytes; ";
            auto st = r.pxn->pxnStats();
            if (st.forwarded_bytes < bytes) why << "forwarded " << st.forwarded_bytes << "; ";
            if (!why.str().empty()) reply = "FAIL " + why.str();
        } else if (cmd == "stats") {
            reply = formatStats(*r.pxn);
        } else if (cmd == "timeout") {
            int64_t secs = -1;
            in >> secs;
            globalConfig().slice_timeout = secs;
        } else if (cmd == "opbatches") {
            reply = "OK " + std::to_string(r.pxn->pxnStats().op_batches);
        } else if (cmd == "rekey") {
            // decode seg's buffer registered again: a new key on its NIC.
            uint64_t seg = 0, rkey = 0;
            in >> seg >> rkey;
            auto d = r.meta->getSegmentDescByID(seg);
            if (!d) {
                reply = "FAIL no segment " + std::to_string(seg);
            } else {
                auto next = std::make_shared<TransferMetadata::SegmentDesc>(*d);
                size_t nic = seg == kDecode0 ? 0 : 1;
                next->buffers[0].rkey[nic] = static_cast<uint32_t>(rkey);
                r.meta->addLocalSegment(seg, next->name, std::move(next));
                seam::setTargetKey(seg, static_cast<uint32_t>(rkey));
            }
        } else if (cmd == "close") {
            reply = closeHeld(r);
        } else if (cmd == "freed") {
            auto st = r.pxn->pxnStats();
            if (st.op_batches != 0 || st.tasks != 0 || st.pxn_batches != 0)
                reply = "FAIL relay holds " + std::to_string(st.op_batches) +
                        " op batches";
        } else {
            reply = "FAIL unknown command " + cmd;
        }
        std::cout << reply << std::endl;
    }
    seam::release(0);
    r.mt.reset();
    return 0;
}

size_t threads() {
    size_t n = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return 0;
    while (auto *e = readdir(d))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

bool libpxnLoaded() {
    FILE *f = std::fopen("/proc/self/maps", "r");
    if (!f) return false;
    char buf[4096];
    bool found = false;
    while (std::fgets(buf, sizeof buf, f))
        if (std::strstr(buf, "libpxn")) found = true;
    std::fclose(f);
    return found;
}

// The same work through RdmaTransport and through PxnRdmaTransport with PXN
// off: the same posts, the same states.
std::vector<seam::Post> drive(RdmaTransport &t, std::shared_ptr<TransferMetadata> meta,
                              std::vector<TransferStatusEnum> &states,
                              char *device, char *host) {
    size_t p0 = seam::posts().size();
    t.registerLocalMemory(device, kSrcLen, "cuda:0", true, true);
    t.registerLocalMemory(host, kHostLen, "cpu:0", true, true);
    std::vector<TransferRequest> reqs = {
        write(device, kDecode0, kBase0, 1 << 20),
        write(device + (1 << 20), kDecode1, kBase1, (8 << 20) + 1),
        write(host, kDecode1, kBase1 + (16 << 20), 1 << 16),
        write(device, kDecode1, kBase1 + (17 << 20), 0),
    };
    reqs.push_back(reqs[0]);
    reqs.back().opcode = TransferRequest::READ;
    BatchID b = t.allocateBatchID(reqs.size());
    Status s = t.submitTransfer(b, reqs);
    EXPECT(s.ok(), "submitTransfer: " << s.ToString());
    for (size_t i = 0; i < reqs.size(); i++) {
        TransferStatus st;
        until([&] {
            t.getTransferStatus(b, i, st);
            return isFinal(st.s);
        }, "task to end");
        states.push_back(st.s);
    }
    EXPECT(t.freeBatchID(b).ok(), "freeBatchID");
    t.unregisterLocalMemory(device, true);
    t.unregisterLocalMemory(host, true);
    (void)meta;
    auto all = seam::posts();
    return std::vector<seam::Post>(all.begin() + p0, all.end());
}

int runOff() {
    int failed = 0;
    auto check = [&](const std::string &name, const std::function<void()> &f) {
        try {
            f();
            std::cout << "PASS " << name << std::endl;
        } catch (const CaseFailed &c) {
            std::cout << "FAIL " << name << ": " << c.why << std::endl;
            failed++;
        }
    };
    check("off_factory", [&] {
        Rank r;
        setUp(r, 0);
        EXPECT(r.rdma != nullptr && r.pxn == nullptr,
               "with MC_PXN_ENABLE unset the factory built a PxnRdmaTransport");
    });
    check("off_like_rdma", [&] {
        HostBuffer deviceMem = hostBuffer(kSrcLen), hostMem = hostBuffer(kHostLen);
        char *device = deviceMem.get(), *host = hostMem.get();
        std::memset(device, 1, kSrcLen);
        std::memset(host, 2, kHostLen);
        auto topo = localTopology(0);
        std::string name = "prefill0";
        Rank plain;
        plain.meta = std::make_shared<TransferMetadata>("P2PHANDSHAKE");
        addDecodeSegments(plain);
        RdmaTransport base;
        EXPECT(base.install(name, plain.meta, topo) == 0, "install");
        std::vector<TransferStatusEnum> want;
        auto wantPosts = drive(base, plain.meta, want, device, host);

        size_t threads0 = threads();
        Rank off;
        off.meta = std::make_shared<TransferMetadata>("P2PHANDSHAKE");
        addDecodeSegments(off);
        PxnRdmaTransport pxn;
        EXPECT(pxn.install(name, off.meta, topo) == 0, "install");
        std::vector<TransferStatusEnum> got;
        auto gotPosts = drive(pxn, off.meta, got, device, host);
        EXPECT(threads() == threads0, "threads " << threads0 << " -> " << threads());
        EXPECT(!libpxnLoaded(), "libpxn was loaded with MC_PXN_ENABLE unset");
        EXPECT(!pxn.pxnStats().active, "PXN active");
        EXPECT(got == want, "states differ");
        EXPECT(gotPosts.size() == wantPosts.size(),
               gotPosts.size() << " posts, RdmaTransport made " << wantPosts.size());
        for (size_t i = 0; i < gotPosts.size(); i++) {
            // Keys are handed out per registration; compare the rest.
            auto a = gotPosts[i], b = wantPosts[i];
            a.lkey = b.lkey = 0;
            EXPECT(a.sameWork(b), "post " << i << " differs");
        }
    });
    std::cout << "DONE" << std::endl;
    return failed ? 1 : 0;
}

// Runs "relay" and "sender" as child processes and carries the sender's
// RELAY lines to the relay and the replies back, as mooncake_test.go does,
// for machines without Go.
int runPair(const char *self, const char *sender_role) {
    struct Child {
        pid_t pid;
        FILE *in;
        FILE *out;
    };
    auto spawn = [&](const char *role) {
        int to[2], from[2];
        if (pipe(to) || pipe(from)) throw CaseFailed{"pipe"};
        pid_t pid = fork();
        if (pid < 0) throw CaseFailed{"fork"};
        if (pid == 0) {
            dup2(to[0], 0);
            dup2(from[1], 1);
            close(to[0]);
            close(to[1]);
            close(from[0]);
            close(from[1]);
            execl(self, self, role, static_cast<char *>(nullptr));
            _exit(127);
        }
        close(to[0]);
        close(from[1]);
        return Child{pid, fdopen(to[1], "w"), fdopen(from[0], "r")};
    };
    auto line = [](FILE *f, std::string &out) {
        char buf[4096];
        if (!std::fgets(buf, sizeof buf, f)) return false;
        out = buf;
        if (!out.empty() && out.back() == '\n') out.pop_back();
        return true;
    };
    Child relay = spawn("relay");
    std::string l;
    if (!line(relay.out, l) || l != "READY") {
        std::cout << (l.rfind("SKIP", 0) == 0 ? l : "FAIL relay: " + l)
                  << std::endl;
        return l.rfind("SKIP", 0) == 0 ? 0 : 1;
    }
    Child sender = spawn(sender_role);
    int failed = 0;
    while (line(sender.out, l)) {
        if (l.rfind("RELAY ", 0) != 0) {
            std::cout << l << std::endl;
            if (l.rfind("FAIL", 0) == 0) failed++;
            continue;
        }
        std::string reply = "FAIL the relay is gone";
        std::fprintf(relay.in, "%s\n", l.substr(6).c_str());
        std::fflush(relay.in);
        line(relay.out, reply);
        std::fprintf(sender.in, "%s\n", reply.c_str());
        std::fflush(sender.in);
    }
    int st = 0;
    waitpid(sender.pid, &st, 0);
    std::fprintf(relay.in, "quit\n");
    std::fflush(relay.in);
    int rst = 0;
    waitpid(relay.pid, &rst, 0);
    return failed || st != 0 ? 1 : 0;
}

// The transport needs a libpxn of its API version; an older one leaves PXN
// off, which the relay and sender cases cannot test.
bool libpxnSpeaksOurVersion() {
    void *lib = dlopen("libpxn.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        std::cout << "FAIL setup: " << dlerror() << std::endl;
        return false;
    }
    auto version =
        reinterpret_cast<uint32_t (*)()>(dlsym(lib, "pxn_api_version"));
    uint32_t v = version ? version() : 0;
    if (v < PXN_API_VERSION) {
        std::cout << "SKIP libpxn.so speaks API version " << v
                  << "; the transport needs " << PXN_API_VERSION << std::endl;
        return false;
    }
    return true;
}

}  // namespace

int main(int argc, char **argv) {
    std::ios::sync_with_stdio(true);
    std::string role = argc > 1 ? argv[1] : "";
    try {
        if (role == "sender" || role == "relay" || role == "bench-sender") {
            if (!libpxnSpeaksOurVersion()) return 0;
        }
        if (role == "sender") return runSender();
        if (role == "relay") return runRelay();
        if (role == "off") return runOff();
        if (role == "pair") return runPair("/proc/self/exe", "sender");
        if (role == "bench") return runPair("/proc/self/exe", "bench-sender");
        if (role == "bench-sender") return runBench();
    } catch (const CaseFailed &f) {
        std::cout << "FAIL setup: " << f.why << std::endl;
        return 1;
    }
    std::cerr << "usage: pxn_transport_test sender|relay|off|pair|bench"
              << std::endl;
    return 2;
}
