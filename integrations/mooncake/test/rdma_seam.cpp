// SPDX-License-Identifier: Apache-2.0

// The link seam: Mooncake's rdma_transport.cpp (and the context, endpoint
// and worker pool behind it) implemented for tests. RdmaTransport posts one
// slice per request to an emulated NIC, which copies the bytes into the
// target's memory on its own thread and completes the slice as a completion
// queue would. The test program links it with mooncake_stubs.cpp in place
// of the rest of Mooncake; a test build of Mooncake's Python module links it
// with the rest of Mooncake's own engine.
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <thread>

#include "config.h"
#include "memory_location.h"
#include "seam.h"
#include "topology.h"
#include "transfer_metadata.h"
#include "transport/rdma_transport/rdma_transport.h"

namespace seam {
namespace {

using Slice = Transport::Slice;

std::atomic<uint64_t> n_allocate_batch{0}, n_segment_lookups{0},
    n_select_device{0}, n_prepared_calls{0}, n_prepared_slices{0},
    n_allocations{0};
thread_local int quiet_depth = 0;

struct Target {
    uint64_t base;
    char *mem;
    size_t len;
};

int memcpyCopy(void *dst, const void *src, size_t n) {
    std::memcpy(dst, src, n);
    return 0;
}

// SEAM_PEERS names a folder where each process's RdmaTransport writes its
// pid under its segment name; the NIC writes into a target no test mapped
// in the process that named itself so, as a NIC writes into a remote
// process's registered memory.
std::string peersDir() {
    const char *d = std::getenv("SEAM_PEERS");
    return d ? d : "";
}

pid_t peerPid(const std::string &segment) {
    std::string dir = peersDir();
    if (dir.empty() || segment.empty() || segment.find('/') != std::string::npos)
        return 0;
    std::ifstream in(dir + "/" + segment);
    long pid = 0;
    if (!(in >> pid) || pid <= 0) return 0;
    return static_cast<pid_t>(pid);
}

bool remoteCopy(pid_t pid, int opcode, void *local, uint64_t remote,
                size_t n) {
    iovec l{local, n};
    iovec r{reinterpret_cast<void *>(remote), n};
    ssize_t done = opcode == Transport::TransferRequest::WRITE
                       ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                       : process_vm_readv(pid, &l, 1, &r, 1, 0);
    return done == static_cast<ssize_t>(n);
}

class Fabric {
   public:
    ~Fabric() {
        {
            std::lock_guard<std::mutex> g(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (worker_.joinable()) worker_.join();
    }

    void post(Slice *s, const Post &p) {
        Quiet q;
        std::lock_guard<std::mutex> g(mu_);
        if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
        posts_.push_back(p);
        queue_.push_back({s, p.target});
        cv_.notify_all();
    }

    struct Queued {
        Slice *slice;
        std::string target;
    };

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Queued> queue_;
    bool holding_ = false;
    size_t budget_ = 0;
    bool stop_ = false;
    std::vector<Post> posts_;
    std::vector<Registration> regs_;
    std::map<uint64_t, Target> targets_;
    std::set<uint64_t> failing_;
    std::map<uint64_t, uint32_t> keys_;
    CopyFn copy_ = &memcpyCopy;
    std::thread worker_;

   private:
    void run() {
        Quiet q;
        std::unique_lock<std::mutex> l(mu_);
        for (;;) {
            cv_.wait(l, [&] {
                return stop_ || (!queue_.empty() && (!holding_ || budget_ > 0));
            });
            if (stop_) return;
            Slice *s = queue_.front().slice;
            std::string target = std::move(queue_.front().target);
            queue_.pop_front();
            if (holding_) budget_--;
            bool ok = failing_.count(s->target_id) == 0;
            auto key = keys_.find(s->target_id);
            if (key != keys_.end() && key->second != s->rdma.dest_rkey)
                ok = false;
            auto it = targets_.find(s->target_id);
            char *remote = nullptr;
            if (it != targets_.end()) {
                const Target &t = it->second;
                uint64_t d = s->rdma.dest_addr;
                if (d >= t.base && d - t.base <= t.len &&
                    s->length <= t.len - (d - t.base))
                    remote = t.mem + (d - t.base);
            }
            CopyFn copy = copy_;
            l.unlock();
            pid_t peer = remote == nullptr ? peerPid(target) : 0;
            if (ok && remote != nullptr) {
                int rc = s->opcode == Transport::TransferRequest::WRITE
                             ? copy(remote, s->source_addr, s->length)
                             : copy(s->source_addr, remote, s->length);
                ok = rc == 0;
            } else if (ok && peer > 0) {
                ok = remoteCopy(peer, s->opcode, s->source_addr,
                                s->rdma.dest_addr, s->length);
            } else {
                ok = false;
            }
            if (ok)
                s->markSuccess();
            else
                s->markFailed();
            l.lock();
        }
    }
};

Fabric &fabric() {
    static Fabric f;
    return f;
}

}  // namespace

void mapTarget(uint64_t segment_id, uint64_t base, void *mem, size_t len) {
    std::lock_guard<std::mutex> g(fabric().mu_);
    fabric().targets_[segment_id] = Target{base, static_cast<char *>(mem), len};
}

void setCopy(CopyFn fn) {
    std::lock_guard<std::mutex> g(fabric().mu_);
    fabric().copy_ = fn ? fn : &memcpyCopy;
}

std::vector<Post> posts() {
    std::lock_guard<std::mutex> g(fabric().mu_);
    return fabric().posts_;
}

std::vector<Registration> registrations() {
    std::lock_guard<std::mutex> g(fabric().mu_);
    return fabric().regs_;
}

void hold() {
    std::lock_guard<std::mutex> g(fabric().mu_);
    fabric().holding_ = true;
    fabric().budget_ = 0;
}

namespace {

// The queued slices of the first n tasks waiting, past the first skip
// slices (those already released); fabric's mu_ held.
size_t slicesOfTasks(size_t skip, size_t n) {
    const auto &q = fabric().queue_;
    std::set<const Transport::TransferTask *> seen;
    size_t k = skip;
    for (; k < q.size(); k++) {
        if (seen.insert(q[k].slice->task).second && seen.size() > n) break;
    }
    return k - skip;
}

}  // namespace

void release(size_t n) {
    {
        Quiet q;
        std::lock_guard<std::mutex> g(fabric().mu_);
        if (n == 0) {
            fabric().holding_ = false;
            fabric().budget_ = 0;
        } else {
            fabric().budget_ += slicesOfTasks(fabric().budget_, n);
        }
    }
    fabric().cv_.notify_all();
}

size_t held() {
    Quiet q;
    std::lock_guard<std::mutex> g(fabric().mu_);
    std::set<const Transport::TransferTask *> tasks;
    for (const auto &q : fabric().queue_) tasks.insert(q.slice->task);
    return tasks.size();
}

void failTarget(uint64_t segment_id, bool fail) {
    std::lock_guard<std::mutex> g(fabric().mu_);
    if (fail)
        fabric().failing_.insert(segment_id);
    else
        fabric().failing_.erase(segment_id);
}

void setTargetKey(uint64_t segment_id, uint32_t rkey) {
    std::lock_guard<std::mutex> g(fabric().mu_);
    if (rkey == 0)
        fabric().keys_.erase(segment_id);
    else
        fabric().keys_[segment_id] = rkey;
}

Counts counts() {
    return Counts{n_allocate_batch.load(), n_segment_lookups.load(),
                  n_select_device.load(),  n_prepared_calls.load(),
                  n_prepared_slices.load(), n_allocations.load()};
}

Quiet::Quiet() { quiet_depth++; }

Quiet::~Quiet() { quiet_depth--; }

void noteSegmentLookup() { n_segment_lookups++; }

void noteAllocateBatch() { n_allocate_batch++; }

void noteAllocation() {
    if (quiet_depth == 0) n_allocations.fetch_add(1, std::memory_order_relaxed);
}

void noteRegistration(const Registration &r) {
    std::lock_guard<std::mutex> g(fabric().mu_);
    fabric().regs_.push_back(r);
}

void noteUnregistration(uint64_t addr) {
    std::lock_guard<std::mutex> g(fabric().mu_);
    for (auto &r : fabric().regs_)
        if (r.addr == addr) r.live = false;
}

void postSlice(Slice *s, const Post &p) { fabric().post(s, p); }

}  // namespace seam

// The NIC's hold for a process that has no other way to reach it (a
// Python process running a test build of Mooncake's module, through
// ctypes).
extern "C" {
void pxn_seam_hold() { seam::hold(); }
void pxn_seam_release(size_t n) { seam::release(n); }
size_t pxn_seam_held() { return seam::held(); }
}

namespace mooncake {

// rdma_transport.cpp

RdmaTransport::RdmaTransport() {}

RdmaTransport::~RdmaTransport() {}

int RdmaTransport::install(std::string &local_server_name,
                           std::shared_ptr<TransferMetadata> meta,
                           std::shared_ptr<Topology> topo) {
    if (topo == nullptr) return ERR_INVALID_ARGUMENT;
    metadata_ = meta;
    local_server_name_ = local_server_name;
    local_topology_ = topo;
    auto desc = std::make_shared<SegmentDesc>();
    desc->name = local_server_name;
    desc->protocol = "rdma";
    desc->topology = *topo;
    for (const auto &hca : topo->getHcaList()) {
        TransferMetadata::DeviceDesc d;
        d.name = hca;
        d.lid = 0;
        d.gid = "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00";
        desc->devices.push_back(d);
    }
    metadata_->addLocalSegment(LOCAL_SEGMENT_ID, local_server_name,
                               std::move(desc));
    // No peer connects a queue pair through the seam; the daemon serves
    // the segment's descriptor to peers that ask for it (P2P handshake).
    int rc = metadata_->startHandshakeDaemon(
        [](const HandShakeDesc &, HandShakeDesc &) { return 0; },
        metadata_->localRpcMeta().rpc_port, metadata_->localRpcMeta().sockfd);
    if (rc == 0) rc = metadata_->updateLocalSegmentDesc();
    if (rc) return rc;
    std::string dir = seam::peersDir();
    if (!dir.empty()) {
        std::ofstream out(dir + "/" + local_server_name);
        out << getpid() << "\n";
        if (!out) return ERR_INVALID_ARGUMENT;
    }
    return 0;
}

int RdmaTransport::registerLocalMemory(void *addr, size_t length,
                                       const std::string &name,
                                       bool remote_accessible,
                                       bool update_metadata) {
    return registerLocalMemoryInternal(addr, length, name, remote_accessible,
                                       update_metadata, false);
}

int RdmaTransport::registerLocalMemoryInternal(void *addr, size_t length,
                                               const std::string &name,
                                               bool remote_accessible,
                                               bool update_metadata, bool) {
    static std::atomic<uint32_t> next_key{0x100};
    BufferDesc b;
    b.name = name;
    if (name == kWildcardLocation) {
        // Mooncake asks the memory where it lies (cuda:N for GPU memory);
        // SEAM_WILDCARD_LOCATION says it for the host memory tests use.
        const char *loc = std::getenv("SEAM_WILDCARD_LOCATION");
        b.name = loc && *loc ? loc : "cpu:0";
    }
    b.addr = reinterpret_cast<uint64_t>(addr);
    b.length = length;
    for (size_t i = 0; i < local_topology_->getHcaList().size(); i++) {
        uint32_t k = next_key++;
        b.lkey.push_back(k);
        if (remote_accessible) b.rkey.push_back(k | 0x10000);
    }
    int rc = metadata_->addLocalMemoryBuffer(b, update_metadata);
    if (rc) return rc;
    seam::noteRegistration(seam::Registration{
        b.addr, length, b.name, remote_accessible, update_metadata,
        b.lkey.empty() ? 0u : b.lkey[0], true});
    return 0;
}

int RdmaTransport::unregisterLocalMemory(void *addr, bool update_metadata) {
    return unregisterLocalMemoryInternal(addr, update_metadata, false);
}

int RdmaTransport::unregisterLocalMemoryInternal(void *addr,
                                                 bool update_metadata, bool) {
    int rc = metadata_->removeLocalMemoryBuffer(addr, update_metadata);
    if (rc == 0) seam::noteUnregistration(reinterpret_cast<uint64_t>(addr));
    return rc;
}

int RdmaTransport::registerLocalMemoryBatch(
    const std::vector<BufferEntry> &buffer_list, const std::string &location) {
    for (const auto &b : buffer_list) {
        int rc = registerLocalMemoryInternal(b.addr, b.length, location, true,
                                             false, true);
        if (rc) return rc;
    }
    return 0;
}

int RdmaTransport::unregisterLocalMemoryBatch(
    const std::vector<void *> &addr_list) {
    int first = 0;
    for (auto *a : addr_list) {
        int rc = unregisterLocalMemoryInternal(a, false, true);
        if (rc && !first) first = rc;
    }
    return first;
}

Status RdmaTransport::submitTransfer(
    BatchID batch_id, const std::vector<TransferRequest> &entries) {
    auto &batch = toBatchDesc(batch_id);
    if (batch.task_list.size() + entries.size() > batch.batch_size)
        return Status::InvalidArgument("batch capacity exceeded");
    std::vector<TransferTask *> tasks;
    for (const auto &r : entries) {
        auto &task = batch.task_list.emplace_back();
        task.batch_id = batch_id;
        task.request = &r;
        tasks.push_back(&task);
    }
    return submitTransferTask(tasks);
}

namespace {

bool localKey(const TransferMetadata::SegmentDesc &local, uint64_t src,
              uint64_t len, uint32_t &key) {
    seam::n_select_device++;
    for (const auto &b : local.buffers) {
        if (b.lkey.empty() || src < b.addr || src - b.addr > b.length ||
            len > b.length - (src - b.addr))
            continue;
        key = b.lkey[0];
        return true;
    }
    return false;
}

bool remoteKey(const TransferMetadata::SegmentDesc &target, uint64_t dst,
               uint64_t len, uint32_t &key) {
    auto matrix = target.topology.getMatrix();
    const auto &hcas = target.topology.getHcaList();
    for (const auto &b : target.buffers) {
        if (b.rkey.empty() || dst < b.addr || dst - b.addr > b.length ||
            len > b.length - (dst - b.addr))
            continue;
        auto it = matrix.find(b.name);
        if (it == matrix.end() || it->second.preferred_hca.empty())
            return false;
        auto pos = std::find(hcas.begin(), hcas.end(),
                             it->second.preferred_hca[0]);
        size_t idx = static_cast<size_t>(pos - hcas.begin());
        if (pos == hcas.end() || idx >= b.rkey.size()) return false;
        key = b.rkey[idx];
        return true;
    }
    return false;
}

}  // namespace

// As the real one: a request in slices of at most slice_size, each
// selecting its local key (the stand-in for selectDevice) and its remote
// key; the target's descriptor looked up once per request. A task's slices
// are all counted before the first is posted.
Status RdmaTransport::submitTransferTask(
    const std::vector<TransferTask *> &task_list) {
    auto local = metadata_->getSegmentDescByID(LOCAL_SEGMENT_ID);
    const uint64_t block = globalConfig().slice_size ? globalConfig().slice_size : 65536;
    Status result = Status::OK();
    thread_local std::vector<std::pair<Slice *, seam::Post>> ready;
    for (auto *tp : task_list) {
        auto &task = *tp;
        ready.clear();
        for (size_t k = 0; k < task.request_count; k++) {
            const auto &r = task.request[k];
            auto target = r.length ? metadata_->getSegmentDescByID(r.target_id)
                                   : nullptr;
            for (uint64_t off = 0; off < r.length; off += block) {
                uint64_t len = std::min<uint64_t>(block, r.length - off);
                char *src = static_cast<char *>(r.source) + off;
                Slice *s = getSliceCache().allocate();
                s->source_addr = src;
                s->length = len;
                s->opcode = r.opcode;
                s->target_id = r.target_id;
                s->peer_nic_path.clear();
                s->source_location.clear();
                s->status = Slice::PENDING;
                s->task = &task;
                s->rdma.dest_addr = r.target_offset + off;
                s->rdma.retry_cnt = 0;
                s->rdma.max_retry_cnt = 0;
                s->ts = 0;
                task.slice_list.push_back(s);
                task.total_bytes += len;
                __sync_fetch_and_add(&task.slice_count, 1);
                uint32_t lkey = 0, rkey = 0;
                if (!local || !target ||
                    !localKey(*local, reinterpret_cast<uint64_t>(src), len, lkey) ||
                    !remoteKey(*target, r.target_offset + off, len, rkey)) {
                    s->markFailed();
                    result = Status::AddressNotRegistered(
                        "no registered range for the request");
                    continue;
                }
                s->rdma.source_lkey = lkey;
                s->rdma.dest_rkey = rkey;
                ready.emplace_back(
                    s, seam::Post{&task, static_cast<int>(r.opcode),
                                  reinterpret_cast<uint64_t>(src), len,
                                  r.target_id, r.target_offset + off, lkey,
                                  rkey, false, std::string(), target->name});
            }
        }
        for (auto &[s, post] : ready) {
            s->status = Slice::POSTED;
            s->ts = getCurrentTimeInNano();
            seam::postSlice(s, post);
        }
    }
    return result;
}

// As WorkerPool's entry: a slice without a peer NIC path fails; the others
// go to the NIC as they are, with no lookup.
int RdmaTransport::submitPreparedSlices(int device_id,
                                        const std::vector<Slice *> &slice_list) {
    seam::Quiet q;
    seam::n_prepared_calls++;
    if (device_id < 0 ||
        static_cast<size_t>(device_id) >= local_topology_->getHcaList().size())
        return ERR_INVALID_ARGUMENT;
    for (Slice *s : slice_list) {
        seam::n_prepared_slices++;
        if (s->peer_nic_path.empty()) {
            s->markFailed();
            continue;
        }
        s->status = Slice::POSTED;
        s->ts = getCurrentTimeInNano();
        // A NIC path is the segment's name, '@', the NIC's.
        const auto &path = s->peer_nic_path;
        seam::postSlice(
            s, seam::Post{s->task, static_cast<int>(s->opcode),
                          reinterpret_cast<uint64_t>(s->source_addr), s->length,
                          s->target_id, s->rdma.dest_addr, s->rdma.source_lkey,
                          s->rdma.dest_rkey, true, path,
                          path.substr(0, path.rfind('@'))});
    }
    return 0;
}

// What Mooncake's RdmaContext and WorkerPool call back into. No context
// exists under the seam (a module build links Mooncake's only because
// show_links.cpp names it), so nothing calls these.
int RdmaTransport::refreshLocalDeviceDesc(const std::string &, uint16_t,
                                          const std::string &) {
    return ERR_DEVICE_NOT_FOUND;
}

int RdmaTransport::selectDevice(SegmentDesc *, uint64_t, size_t,
                                std::string_view, int &, int &, int) {
    return ERR_ADDRESS_NOT_REGISTERED;
}

int RdmaTransport::selectDeviceByLocalHca(SegmentDesc *, uint64_t, size_t,
                                          std::string_view, int &, int &,
                                          int) {
    return ERR_ADDRESS_NOT_REGISTERED;
}

Status RdmaTransport::getTransferStatus(BatchID batch_id, size_t task_id,
                                        TransferStatus &status) {
    auto &batch = toBatchDesc(batch_id);
    if (task_id >= batch.task_list.size())
        return Status::InvalidArgument("task id out of range");
    auto &task = batch.task_list[task_id];
    status.transferred_bytes = task.transferred_bytes;
    uint64_t ok = __atomic_load_n(&task.success_slice_count, __ATOMIC_ACQUIRE);
    uint64_t bad = __atomic_load_n(&task.failed_slice_count, __ATOMIC_ACQUIRE);
    if (ok + bad == task.slice_count) {
        status.s = bad ? TransferStatusEnum::FAILED
                       : TransferStatusEnum::COMPLETED;
        task.is_finished = true;
    } else {
        status.s = TransferStatusEnum::WAITING;
    }
    return Status::OK();
}

Status RdmaTransport::getTransferStatus(BatchID batch_id,
                                        std::vector<TransferStatus> &status) {
    auto &batch = toBatchDesc(batch_id);
    status.resize(batch.task_list.size());
    for (size_t i = 0; i < batch.task_list.size(); i++)
        getTransferStatus(batch_id, i, status[i]);
    return Status::OK();
}

}  // namespace mooncake
