// SPDX-License-Identifier: Apache-2.0

// The ops libpxn hands over one by one (its transport's submit).
#ifndef PXN_MOONCAKE_PXN_OP_PATH_H
#define PXN_MOONCAKE_PXN_OP_PATH_H

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "pxn_common.h"
#include "pxn_segment_cache.h"

namespace mooncake {
namespace pxn {

// Ops libpxn submits, posted through RdmaTransport as the tasks of
// internal batches, and reported back to libpxn's poll as those tasks end.
class OpPath {
   public:
    OpPath(RdmaTransport &rdma, SegmentCache &segments)
        : rdma_(rdma), segments_(segments) {}

    // Posts ops; an op whose target is unknown or stale is refused through
    // a later poll.
    int submit(const pxn_transport_op *ops, size_t count);

    // Reports at most capacity completions into out, refusals first.
    size_t poll(pxn_transport_completion *out, size_t capacity);

    // Frees the batches whose tasks RDMA has all finished, reporting
    // nothing to libpxn; returns how many are left.
    size_t sweep();

    // Internal batches not yet freed.
    size_t batches();

   private:
    // Ops libpxn handed over in one submit call, posted through
    // RdmaTransport as the tasks of one internal batch. requests is
    // reserved once: the tasks point into it.
    struct OpBatch {
        BatchID id = 0;
        std::vector<TransferRequest> requests;
        std::vector<uint64_t> tokens;
        // 0 open, 1 reported final, 2 reported as timed out while
        // RdmaTransport still holds its slices (its final report is still
        // owed). open counts the ops whose final report is owed.
        std::vector<uint8_t> state;
        size_t open = 0;
    };

    // Reports what finished in ob, at most cap completions into out (out
    // null: every one, reported nowhere); mu_ held.
    size_t reap(OpBatch &ob, pxn_transport_completion *out, size_t cap);

    // Reaps every live batch, at most cap completions into out (out null:
    // none reported), and frees the batches RDMA has finished; returns the
    // completions reported. mu_ held.
    size_t reapBatches(pxn_transport_completion *out, size_t cap);

    bool finished(const OpBatch &ob);

    RdmaTransport &rdma_;
    SegmentCache &segments_;
    std::mutex mu_;
    std::vector<OpBatch *> live_;
    std::vector<pxn_transport_completion> refused_;
};

}  // namespace pxn
}  // namespace mooncake

#endif
