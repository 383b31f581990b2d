// SPDX-License-Identifier: Apache-2.0

// Relayed Pieces libpxn hands over whole (its transport's submit_piece).
#ifndef PXN_MOONCAKE_PXN_PIECE_PATH_H
#define PXN_MOONCAKE_PXN_PIECE_PATH_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pxn_common.h"
#include "pxn_segment_cache.h"

namespace mooncake {
namespace pxn {

// A relayed Piece's ops are checked and resolved first, so a Piece the host
// refuses posts nothing; then cut into slices of at most 64 KiB (Mooncake's
// slice_size when smaller) inside the op's target buffer, carrying the
// arena's key, the route's remote key and peer NIC path, and posted through
// RdmaTransport::submitPreparedSlices on this process's one NIC. The slot's
// task counts them; poll reports the Piece once they are all final. In the
// steady state (a slot free, every route cached) it looks nothing up and
// allocates nothing.
class PiecePath {
   public:
    // device is this process's one NIC's index among RDMA's devices.
    PiecePath(RdmaTransport &rdma, SegmentCache &segments, size_t device)
        : rdma_(rdma), segments_(segments), device_(device) {}

    // Frees the pooled slots; those RDMA still holds are left, with their
    // slices and batches, as the NIC may still complete them.
    ~PiecePath();

    // The staging arena as registered, one range a lane: each range's key
    // on this process's one NIC. A lane given new memory is dropped and
    // added again with its new key.
    void addArena(uintptr_t base, uint64_t len, uint64_t lkey);
    void dropArena(uintptr_t base);

    // Posts a Piece of count ops under token; a Piece refused is reported
    // through a later poll.
    int submit(const pxn_transport_op *ops, size_t count, uint64_t token);

    // Reports at most capacity ended Pieces into out, refusals first.
    size_t poll(pxn_transport_completion *out, size_t capacity);

    // Returns the slots RDMA has finished to the pool, reporting nothing;
    // returns how many Pieces RDMA still holds.
    size_t sweep();

    struct Counts {
        uint64_t in_flight = 0;
        uint64_t slots = 0;
        uint64_t slot_grows = 0;
        uint64_t pieces = 0;
        uint64_t route_misses = 0;
        uint64_t route_drops = 0;
    };
    Counts counts();

   private:
    // A target buffer as resolved: what a slice into it carries, and when
    // it was resolved.
    struct Route {
        uint64_t base = 0;
        uint64_t length = 0;
        uint64_t rkey = 0;
        std::string peer_nic_path;
        int64_t resolved = 0;
    };

    // One relayed Piece in flight: the one task of an internal batch made
    // once, its slices counted on it. Slots, their batches and their slices
    // are kept for later Pieces.
    struct Slot {
        BatchID batch = 0;
        TransferTask *task = nullptr;
        // Owned; as many as the largest Piece this slot carried needed.
        std::vector<Slice *> slices;
        // The first n of slices, as posted.
        std::vector<Slice *> post;
        // Where each op of the Piece goes.
        struct Hop {
            SegmentID id;
            std::vector<Route> *list;
            size_t index;
        };
        std::vector<Hop> hops;
        // The routes used, as (segment, buffer base), dropped if a slice
        // fails.
        std::vector<std::pair<SegmentID, uint64_t>> used;
        uint64_t token = 0;
        // Reported timed out while RDMA still holds slices of it.
        bool reported = false;
    };

    // The route for op, from the cache or resolved into it; PXN_OK, or why
    // the op cannot go. Entries the earlier ops of p point at stay where
    // they are. mu_ held.
    int routeFor(const Slot &p, const pxn_transport_op &op, int64_t now,
                 SegmentID &id, std::vector<Route> *&list, size_t &index,
                 std::string &why);

    // A slot whose batch, task and vectors are ready; mu_ held.
    Slot *takeSlot();

    // Readies p's task and batch to count n slices of bytes in all.
    static void armTask(Slot &p, uint64_t n, uint64_t bytes);

    // Drops the cached routes p used; mu_ held.
    void dropRoutes(const Slot &p);

    // Reports ended Pieces, at most capacity (out null: none reported),
    // and returns finished slots to the pool; mu_ held.
    size_t reap(pxn_transport_completion *out, size_t capacity);

    RdmaTransport &rdma_;
    SegmentCache &segments_;
    const size_t device_;

    std::mutex mu_;
    // The key of the arena range [src, src+len) lies in, or null; the
    // caller holds mu_.
    const uint64_t *arenaKey(uintptr_t src, uint64_t len) const;
    struct ArenaRange {
        uintptr_t base;
        uint64_t len;
        uint64_t lkey;
    };
    std::vector<ArenaRange> arena_;
    // A route cache per target segment.
    std::unordered_map<SegmentID, std::vector<Route>> routes_;
    std::vector<Slot *> free_slots_;
    std::vector<Slot *> flying_;
    size_t slots_made_ = 0;
    // Times a slot grew its slices or its per-op vectors.
    size_t slot_grows_ = 0;
    std::vector<pxn_transport_completion> refused_;
    std::atomic<uint64_t> pieces_{0};
    std::atomic<uint64_t> route_misses_{0};
    std::atomic<uint64_t> route_drops_{0};
};

}  // namespace pxn
}  // namespace mooncake

#endif
