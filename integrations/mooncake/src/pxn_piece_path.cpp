// SPDX-License-Identifier: Apache-2.0

#include "pxn_piece_path.h"

#include <glog/logging.h>

#include <algorithm>

#include "common.h"
#include "config.h"

namespace mooncake {
namespace pxn {

namespace {

// The longest slice the Piece path posts; Mooncake's slice_size when
// smaller.
constexpr uint64_t kPieceSliceMax = 64 << 10;

// How long a cached route is used before it is looked up again, as
// Mooncake's own CONFIG_CACHE_SEGMENT_DESC keeps descriptors.
constexpr int64_t kRouteMaxAgeNs = 1000000000;

// Bounds on the route cache: past them it starts over.
constexpr size_t kMaxRouteSegments = 1024;
constexpr size_t kMaxRoutesPerSegment = 4096;

}  // namespace

PiecePath::~PiecePath() {
    std::lock_guard<std::mutex> g(mu_);
    reap(nullptr, 0);
    for (Slot *p : free_slots_) {
        for (Slice *s : p->slices) delete s;
        rdma_.Transport::freeBatchID(p->batch);
        delete p;
    }
    free_slots_.clear();
    if (!flying_.empty())
        LOG(WARNING) << "PXN: " << flying_.size()
                     << " relayed Pieces still held by RDMA are left "
                        "allocated";
}

void PiecePath::addArena(uintptr_t base, uint64_t len, uint64_t lkey) {
    std::lock_guard<std::mutex> g(mu_);
    arena_.push_back(ArenaRange{base, len, lkey});
}

void PiecePath::dropArena(uintptr_t base) {
    std::lock_guard<std::mutex> g(mu_);
    arena_.erase(std::remove_if(arena_.begin(), arena_.end(),
                                [base](const ArenaRange &r) {
                                    return r.base == base;
                                }),
                 arena_.end());
}

const uint64_t *PiecePath::arenaKey(uintptr_t src, uint64_t len) const {
    for (const auto &r : arena_)
        if (src >= r.base && src - r.base <= r.len && len <= r.len - (src - r.base))
            return &r.lkey;
    return nullptr;
}

int PiecePath::routeFor(const Slot &p, const pxn_transport_op &op,
                        int64_t now, SegmentID &id, std::vector<Route> *&list,
                        size_t &index, std::string &why) {
    bool routed = (op.flags & PXN_OP_ROUTED) != 0;
    if (routed) {
        id = op.route;
    } else if (!segments_.idOf(op.target, id)) {
        why = std::string("unknown segment ") + op.target;
        return PXN_EINVAL;
    }
    auto it = routes_.find(id);
    if (it == routes_.end())
        it = routes_.emplace(id, std::vector<Route>()).first;
    list = &it->second;
    size_t stale = list->size();
    for (size_t i = 0; i < list->size(); i++) {
        const Route &r = (*list)[i];
        if (op.dst < r.base || op.dst - r.base > r.length ||
            op.len > r.length - (op.dst - r.base))
            continue;
        if ((routed && r.rkey != op.remote_key) ||
            now - r.resolved > kRouteMaxAgeNs) {
            stale = i;
            break;
        }
        index = i;
        return PXN_OK;
    }
    route_misses_++;
    auto desc = segments_.desc(id);
    Target t;
    if (!desc || !segments_.target(id, desc, op.dst, op.len, t) ||
        t.device >= desc->devices.size() ||
        (routed && t.rkey != op.remote_key)) {
        if (stale < list->size()) {
            list->erase(list->begin() + stale);
            route_drops_++;
        }
        why = "segment " + std::to_string(id) +
              " no longer holds the range with that key";
        return routed ? PXN_ESTALE : PXN_EINVAL;
    }
    if (stale == list->size()) {
        bool in_use = false;
        for (const auto &h : p.hops) in_use = in_use || h.list == list;
        if (list->size() >= kMaxRoutesPerSegment && !in_use) list->clear();
        stale = list->size();
        list->emplace_back();
    }
    Route &r = (*list)[stale];
    r.base = t.base;
    r.length = t.length;
    r.rkey = t.rkey;
    r.peer_nic_path = MakeNicPath(desc->nicPathServerName(),
                                  desc->devices[t.device].name);
    r.resolved = now;
    index = stale;
    return PXN_OK;
}

PiecePath::Slot *PiecePath::takeSlot() {
    if (!free_slots_.empty()) {
        Slot *p = free_slots_.back();
        free_slots_.pop_back();
        return p;
    }
    auto *p = new Slot;
    p->batch = rdma_.Transport::allocateBatchID(1);
    auto &bd = Transport::toBatchDesc(p->batch);
    p->task = &bd.task_list.emplace_back();
    p->task->batch_id = p->batch;
    p->task->is_finished = true;
    slots_made_++;
    // Returning a slot or flying one never allocates.
    free_slots_.reserve(slots_made_);
    flying_.reserve(slots_made_);
    return p;
}

void PiecePath::armTask(Slot &p, uint64_t n, uint64_t bytes) {
    TransferTask &t = *p.task;
    t.slice_count = n;
    t.success_slice_count = 0;
    t.failed_slice_count = 0;
    t.transferred_bytes = 0;
    t.is_finished = false;
    t.total_bytes = bytes;
    auto &bd = Transport::toBatchDesc(p.batch);
    bd.has_failure.store(false, std::memory_order_relaxed);
    bd.is_finished.store(false, std::memory_order_relaxed);
#ifdef USE_EVENT_DRIVEN_COMPLETION
    t.completed_slice_count = 0;
    t.submission_sealed = true;
    t.completion_published = false;
    bd.finished_task_count.store(0, std::memory_order_relaxed);
#endif
}

int PiecePath::submit(const pxn_transport_op *ops, size_t count,
                      uint64_t token) {
    if (count == 0) return PXN_EINVAL;
    std::lock_guard<std::mutex> g(mu_);
    int64_t now = getCurrentTimeInNano();
    uint64_t slice_max = kPieceSliceMax;
    if (globalConfig().slice_size > 0 && globalConfig().slice_size < slice_max)
        slice_max = globalConfig().slice_size;
    if (routes_.size() >= kMaxRouteSegments) routes_.clear();
    Slot *p = takeSlot();
    p->hops.clear();
    p->used.clear();
    p->reported = false;
    p->token = token;
    bool grew = false;
    if (p->hops.capacity() < count) {
        p->hops.reserve(count);
        p->used.reserve(count);
        grew = true;
    }
    uint64_t n = 0, bytes = 0;
    std::string why;
    for (size_t i = 0; i < count; i++) {
        const auto &op = ops[i];
        auto src = reinterpret_cast<uintptr_t>(op.src);
        int rc = PXN_OK;
        if (op.len == 0) {
            rc = PXN_EINVAL;
            why = "an empty op";
        } else if (!(op.flags & PXN_OP_LOCAL_KEY) &&
                   arenaKey(src, op.len) == nullptr) {
            rc = PXN_EINVAL;
            why = "an op from outside the staging arena without a key";
        }
        SegmentID id = 0;
        std::vector<Route> *list = nullptr;
        size_t index = 0;
        if (rc == PXN_OK) rc = routeFor(*p, op, now, id, list, index, why);
        if (rc != PXN_OK) {
            free_slots_.push_back(p);
            refused_.push_back(completion(token, rc, why));
            return PXN_OK;
        }
        p->hops.push_back(Slot::Hop{id, list, index});
        uint64_t base = (*list)[index].base;
        if (p->used.empty() || p->used.back().first != id ||
            p->used.back().second != base)
            p->used.emplace_back(id, base);
        n += (op.len + slice_max - 1) / slice_max;
        bytes += op.len;
    }
    if (p->slices.size() < n) {
        while (p->slices.size() < n) p->slices.push_back(new Slice());
        p->post.reserve(n);
        grew = true;
    }
    if (grew) slot_grows_++;
    p->post.clear();
    armTask(*p, n, bytes);
    int max_retry = globalConfig().retry_cnt;
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        const auto &op = ops[i];
        const auto &hop = p->hops[i];
        const Route &r = (*hop.list)[hop.index];
        uint64_t lkey = (op.flags & PXN_OP_LOCAL_KEY)
                            ? op.local_key
                            : *arenaKey(reinterpret_cast<uintptr_t>(op.src),
                                        op.len);
        auto opcode = op.read ? TransferRequest::READ : TransferRequest::WRITE;
        for (uint64_t off = 0; off < op.len; off += slice_max) {
            Slice *s = p->slices[k++];
            s->source_addr = static_cast<char *>(op.src) + off;
            s->length = std::min(slice_max, op.len - off);
            s->opcode = opcode;
            s->target_id = hop.id;
            s->peer_nic_path = r.peer_nic_path;
            s->source_location.clear();
            s->status = Slice::PENDING;
            s->task = p->task;
            s->from_cache = false;
            s->cleanup_callback = nullptr;
            s->rdma.dest_addr = op.dst + off;
            s->rdma.source_lkey = static_cast<Slice::mr_key_t>(lkey);
            s->rdma.dest_rkey = static_cast<Slice::mr_key_t>(r.rkey);
            s->rdma.retry_cnt = 0;
            s->rdma.max_retry_cnt = max_retry;
            s->ts = 0;
            p->post.push_back(s);
        }
    }
    flying_.push_back(p);
    pieces_++;
    if (rdma_.RdmaTransport::submitPreparedSlices(static_cast<int>(device_),
                                                  p->post) != 0) {
        // No active device took them: each fails, and the Piece with them.
        for (Slice *s : p->post) s->markFailed();
    }
    return PXN_OK;
}

void PiecePath::dropRoutes(const Slot &p) {
    for (const auto &[id, base] : p.used) {
        auto it = routes_.find(id);
        if (it == routes_.end()) continue;
        auto &list = it->second;
        for (size_t i = 0; i < list.size(); i++) {
            if (list[i].base != base) continue;
            list.erase(list.begin() + i);
            route_drops_++;
            break;
        }
    }
}

size_t PiecePath::reap(pxn_transport_completion *out, size_t capacity) {
    size_t n = 0;
    while (n < capacity && out != nullptr && !refused_.empty()) {
        out[n++] = refused_.back();
        refused_.pop_back();
    }
    for (size_t i = 0; i < flying_.size();) {
        Slot *p = flying_[i];
        const TransferTask &t = *p->task;
        uint64_t ok = __atomic_load_n(&t.success_slice_count, __ATOMIC_ACQUIRE);
        uint64_t bad = __atomic_load_n(&t.failed_slice_count, __ATOMIC_ACQUIRE);
        bool done = ok + bad == t.slice_count;
        if (out != nullptr) {
            if (n == capacity) {
                i++;
                continue;
            }
            if (done) {
                // Also the final report of a Piece reported timed out:
                // until this one, libpxn keeps the Piece's slot.
                out[n++] = bad == 0 ? completion(p->token, PXN_OK, "")
                                    : completion(p->token, PXN_EIO,
                                                 "RDMA write failed");
                if (bad != 0 && !p->reported) dropRoutes(*p);
            } else if (!p->reported && slicesTimedOut(p->post)) {
                out[n++] = completion(p->token, PXN_ETIMEDOUT,
                                      "RDMA slice timed out");
                p->reported = true;
                dropRoutes(*p);
            }
        }
        if (!done) {
            i++;
            continue;
        }
        p->task->is_finished = true;
        flying_[i] = flying_.back();
        flying_.pop_back();
        free_slots_.push_back(p);
    }
    return n;
}

size_t PiecePath::poll(pxn_transport_completion *out, size_t capacity) {
    std::lock_guard<std::mutex> g(mu_);
    return reap(out, capacity);
}

size_t PiecePath::sweep() {
    std::lock_guard<std::mutex> g(mu_);
    reap(nullptr, 0);
    return flying_.size();
}

PiecePath::Counts PiecePath::counts() {
    Counts c;
    {
        std::lock_guard<std::mutex> g(mu_);
        c.in_flight = flying_.size();
        c.slots = slots_made_;
        c.slot_grows = slot_grows_;
    }
    c.pieces = pieces_.load();
    c.route_misses = route_misses_.load();
    c.route_drops = route_drops_.load();
    return c;
}

}  // namespace pxn
}  // namespace mooncake
