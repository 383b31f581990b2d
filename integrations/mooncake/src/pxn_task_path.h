// SPDX-License-Identifier: Apache-2.0

// Mooncake tasks that went to libpxn.
#ifndef PXN_MOONCAKE_PXN_TASK_PATH_H
#define PXN_MOONCAKE_PXN_TASK_PATH_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "pxn_api.h"
#include "pxn_common.h"

namespace mooncake {
namespace pxn {

// The tasks of Mooncake's batches that libpxn carries, each with one slice
// that stands for the whole request, and the libpxn batches they were
// submitted in.
class TaskPath {
   public:
    // allocate_slice gives a slice from the calling thread's slice cache.
    TaskPath(Libpxn &lib, Slice *(*allocate_slice)())
        : lib_(lib), allocate_slice_(allocate_slice) {}

    // Takes tasks, which pxn_submit accepted as libpxn batch b, request i
    // of b for tasks[i].
    void adopt(const std::vector<TransferTask *> &tasks, pxn_batch_t b);

    // Reports task, whose slice is s, into out, asking libpxn while it is
    // not final.
    void status(TransferTask &task, Slice &s, TransferStatus &out);

    // Fails every task still held, for a libpxn that has closed (their
    // libpxn batches went with it).
    void failAll();

    // The slice that stands for t when t went to libpxn; null otherwise.
    static Slice *sliceOf(const TransferTask &t);

    // Tasks held, and libpxn batches not yet freed.
    size_t tasks();
    uint64_t batches() const { return live_submissions_.load(); }

   private:
    // One pxn_submit: its libpxn batch is freed once every task of it has
    // been reported final.
    struct Submission {
        pxn_batch_t batch;
        std::atomic<size_t> open;
    };

    struct TaskRef {
        Submission *sub;
        pxn_batch_t batch;
        size_t index;
    };

    // Records the final state of a task exactly once, on whichever thread
    // saw it first, and frees the libpxn batch after its last task.
    void finalize(TransferTask &task, Slice &s, int32_t state,
                  uint64_t transferred);

    Libpxn &lib_;
    Slice *(*allocate_slice_)();
    std::mutex mu_;
    std::unordered_map<const TransferTask *, TaskRef> tasks_;
    std::atomic<uint64_t> live_submissions_{0};
};

}  // namespace pxn
}  // namespace mooncake

#endif
