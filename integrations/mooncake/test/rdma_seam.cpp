// SPDX-License-Identifier: Apache-2.0

// The link seam: what the transport and MultiTransport call in Mooncake's
// own .cpp files, implemented for tests. RdmaTransport posts one slice per
// request to an emulated NIC, which copies the bytes into the target's
// memory on its own thread and completes the slice as a completion queue
// would.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
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
        queue_.push_back(s);
        cv_.notify_all();
    }

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Slice *> queue_;
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
            Slice *s = queue_.front();
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
            if (ok && remote != nullptr) {
                int rc = s->opcode == Transport::TransferRequest::WRITE
                             ? copy(remote, s->source_addr, s->length)
                             : copy(s->source_addr, remote, s->length);
                ok = rc == 0;
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
        if (seen.insert(q[k]->task).second && seen.size() > n) break;
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
    for (auto *s : fabric().queue_) tasks.insert(s->task);
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

namespace mooncake {

// config.cpp

GlobalConfig &globalConfig() {
    static GlobalConfig config;
    return config;
}

// status.cpp

Status::Status(Code code, std::string_view message) : code_(code) {
    if (code == Code::kOk) return;
    char *m = new char[message.size() + 1];
    std::memcpy(m, message.data(), message.size());
    m[message.size()] = '\0';
    message_ = m;
}

const char *Status::CopyMessage(const char *msg) {
    size_t n = std::strlen(msg);
    char *m = new char[n + 1];
    std::memcpy(m, msg, n + 1);
    return m;
}

std::string Status::ToString() const {
    if (ok()) return "OK";
    return "code " + std::to_string(static_cast<int>(code_)) + ": " +
           std::string(message());
}

// topology.cpp: parse takes {"location": [[preferred...], [available...]]};
// the HCA list is every HCA named, in order of first appearance.

Topology::Topology() : use_round_robin_(false) {}

Topology::~Topology() {}

bool Topology::empty() const { return matrix_.empty(); }

int Topology::parse(const std::string &topology_json) {
    Json::Value root;
    Json::Reader reader;
    if (!reader.parse(topology_json, root) || !root.isObject()) return -1;
    matrix_.clear();
    hca_list_.clear();
    auto note = [&](const std::string &hca) {
        if (std::find(hca_list_.begin(), hca_list_.end(), hca) ==
            hca_list_.end())
            hca_list_.push_back(hca);
    };
    for (const auto &loc : root.getMemberNames()) {
        TopologyEntry e;
        e.name = loc;
        const auto &v = root[loc];
        for (const auto &h : v[0]) {
            e.preferred_hca.push_back(h.asString());
            note(h.asString());
        }
        for (const auto &h : v[1]) {
            e.avail_hca.push_back(h.asString());
            note(h.asString());
        }
        matrix_[loc] = e;
    }
    return 0;
}

// transfer_metadata.cpp: a local cache only; nothing is fetched.

TransferMetadata::TransferMetadata(const std::string &) : next_segment_id_(1) {}

TransferMetadata::~TransferMetadata() {}

std::shared_ptr<TransferMetadata::SegmentDesc>
TransferMetadata::getSegmentDescByID(SegmentID segment_id, bool) {
    seam::noteSegmentLookup();
    RWSpinlock::ReadGuard g(segment_lock_);
    auto it = segment_id_to_desc_map_.find(segment_id);
    return it == segment_id_to_desc_map_.end() ? nullptr : it->second;
}

std::shared_ptr<TransferMetadata::SegmentDesc>
TransferMetadata::getSegmentDescByName(const std::string &segment_name, bool) {
    RWSpinlock::ReadGuard g(segment_lock_);
    auto it = segment_name_to_id_map_.find(segment_name);
    if (it == segment_name_to_id_map_.end()) return nullptr;
    auto d = segment_id_to_desc_map_.find(it->second);
    return d == segment_id_to_desc_map_.end() ? nullptr : d->second;
}

TransferMetadata::SegmentID TransferMetadata::getSegmentID(
    const std::string &segment_name) {
    RWSpinlock::ReadGuard g(segment_lock_);
    auto it = segment_name_to_id_map_.find(segment_name);
    return it == segment_name_to_id_map_.end() ? static_cast<SegmentID>(-1)
                                               : it->second;
}

int TransferMetadata::addLocalSegment(SegmentID segment_id,
                                      const std::string &segment_name,
                                      std::shared_ptr<SegmentDesc> &&desc) {
    RWSpinlock::WriteGuard g(segment_lock_);
    segment_id_to_desc_map_[segment_id] = std::move(desc);
    segment_name_to_id_map_[segment_name] = segment_id;
    return 0;
}

int TransferMetadata::addLocalMemoryBuffer(const BufferDesc &buffer_desc,
                                           bool) {
    RWSpinlock::WriteGuard g(segment_lock_);
    auto &cur = segment_id_to_desc_map_[LOCAL_SEGMENT_ID];
    auto next = std::make_shared<SegmentDesc>(*cur);
    next->buffers.push_back(buffer_desc);
    cur = next;
    return 0;
}

int TransferMetadata::removeLocalMemoryBuffer(void *addr, bool) {
    RWSpinlock::WriteGuard g(segment_lock_);
    auto &cur = segment_id_to_desc_map_[LOCAL_SEGMENT_ID];
    auto next = std::make_shared<SegmentDesc>(*cur);
    auto &bs = next->buffers;
    auto n = bs.size();
    bs.erase(std::remove_if(bs.begin(), bs.end(),
                            [&](const BufferDesc &b) {
                                return b.addr ==
                                       reinterpret_cast<uint64_t>(addr);
                            }),
             bs.end());
    if (bs.size() == n) return ERR_ADDRESS_NOT_REGISTERED;
    cur = next;
    return 0;
}

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
    metadata_->addLocalSegment(LOCAL_SEGMENT_ID, local_server_name,
                               std::move(desc));
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
    b.name = name == kWildcardLocation ? "cpu:0" : name;
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
                                  rkey, false, std::string()});
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
        seam::postSlice(
            s, seam::Post{s->task, static_cast<int>(s->opcode),
                          reinterpret_cast<uint64_t>(s->source_addr), s->length,
                          s->target_id, s->rdma.dest_addr, s->rdma.source_lkey,
                          s->rdma.dest_rkey, true, s->peer_nic_path});
    }
    return 0;
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

// The test program's heap allocations, counted (seam::counts); the aligned
// forms are left to the runtime, which pairs them among themselves.
void *operator new(size_t n) {
    seam::noteAllocation();
    if (void *p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}

void *operator new[](size_t n) { return operator new(n); }

void *operator new(size_t n, const std::nothrow_t &) noexcept {
    seam::noteAllocation();
    return std::malloc(n ? n : 1);
}

void *operator new[](size_t n, const std::nothrow_t &) noexcept {
    return operator new(n, std::nothrow);
}

void operator delete(void *p) noexcept { std::free(p); }

void operator delete[](void *p) noexcept { std::free(p); }

void operator delete(void *p, size_t) noexcept { std::free(p); }

void operator delete[](void *p, size_t) noexcept { std::free(p); }

void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }

void operator delete[](void *p, const std::nothrow_t &) noexcept { std::free(p); }

// Transport::allocateBatchID, wrapped at link time (-Wl,--wrap), counted.
extern "C" mooncake::Transport::BatchID
__real__ZN8mooncake9Transport15allocateBatchIDEm(mooncake::Transport *self,
                                                 size_t batch_size);

extern "C" mooncake::Transport::BatchID
__wrap__ZN8mooncake9Transport15allocateBatchIDEm(mooncake::Transport *self,
                                                 size_t batch_size) {
    seam::n_allocate_batch++;
    return __real__ZN8mooncake9Transport15allocateBatchIDEm(self, batch_size);
}
