// SPDX-License-Identifier: Apache-2.0

#include "pxn_task_path.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "common.h"

namespace mooncake {
namespace pxn {

namespace {

// Identifies the one slice of a task that was handed to libpxn. The slice
// stands for the whole request: MultiTransport's slice timeout reads its
// timestamp, and ~TransferTask returns it to the slice cache.
void pxnTaskSlice(Slice *) {}

// Written into such a slice's rdma.retry_cnt, which nothing else reads on
// it, when libpxn reported the task TIMEOUT.
constexpr uint32_t kTimedOutMark = 0x7fffffff;

bool isFinal(int32_t state) {
    return state != PXN_TASK_WAITING && state != PXN_TASK_PENDING;
}

}  // namespace

void TaskPath::adopt(const std::vector<TransferTask *> &tasks,
                     pxn_batch_t b) {
    auto *sub = new Submission{b, {tasks.size()}};
    live_submissions_++;
    int64_t now = getCurrentTimeInNano();
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < tasks.size(); i++) {
        auto &task = *tasks[i];
        const auto &q = task.request[0];
        Slice *s = allocate_slice_();
        s->source_addr = q.source;
        s->length = q.length;
        s->opcode = q.opcode;
        s->target_id = q.target_id;
        s->peer_nic_path.clear();
        s->source_location.clear();
        s->rdma.dest_addr = q.target_offset;
        s->rdma.retry_cnt = 0;
        s->task = &task;
        s->status = Slice::POSTED;
        s->ts = now;
        s->cleanup_callback = &pxnTaskSlice;
        task.slice_list.push_back(s);
        task.total_bytes += q.length;
        __sync_fetch_and_add(&task.slice_count, 1);
        tasks_[&task] = TaskRef{sub, b, i};
    }
}

Slice *TaskPath::sliceOf(const TransferTask &t) {
    if (t.slice_list.size() != 1) return nullptr;
    Slice *s = t.slice_list[0];
    return s->cleanup_callback == &pxnTaskSlice ? s : nullptr;
}

void TaskPath::failAll() {
    std::vector<std::pair<TransferTask *, Submission *>> left;
    {
        std::lock_guard<std::mutex> g(mu_);
        for (auto &kv : tasks_)
            left.emplace_back(const_cast<TransferTask *>(kv.first),
                              kv.second.sub);
        tasks_.clear();
    }
    std::sort(left.begin(), left.end(),
              [](const auto &a, const auto &b) { return a.second < b.second; });
    Submission *prev = nullptr;
    for (auto &[task, sub] : left) {
        if (Slice *sl = sliceOf(*task)) sl->markFailed();
        if (sub != prev) {
            delete sub;
            live_submissions_--;
            prev = sub;
        }
    }
}

size_t TaskPath::tasks() {
    std::lock_guard<std::mutex> g(mu_);
    return tasks_.size();
}

void TaskPath::finalize(TransferTask &task, Slice &s, int32_t state,
                        uint64_t transferred) {
    TaskRef ref;
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = tasks_.find(&task);
        if (it == tasks_.end()) return;
        ref = it->second;
        tasks_.erase(it);
    }
    if (state == PXN_TASK_COMPLETED) {
        s.markSuccess();
    } else {
        __atomic_fetch_add(&task.transferred_bytes, transferred,
                           __ATOMIC_RELAXED);
        // markFailed counts the slice and, in an event-driven build,
        // completes the task and its batch; the mark it cannot carry (it
        // sets FAILED) is written before its count, which readers load
        // with acquire.
        s.rdma.retry_cnt = state == PXN_TASK_TIMEOUT ? kTimedOutMark : 0;
        s.markFailed();
    }
    if (ref.sub->open.fetch_sub(1) == 1) {
        if (lib_.free_batch(lib_.handle, ref.batch) != PXN_OK)
            LOG(WARNING) << "pxn_free_batch: " << lib_.lastError();
        delete ref.sub;
        live_submissions_--;
    }
}

void TaskPath::status(TransferTask &task, Slice &s, TransferStatus &out) {
    uint64_t ok = __atomic_load_n(&task.success_slice_count, __ATOMIC_ACQUIRE);
    uint64_t bad = __atomic_load_n(&task.failed_slice_count, __ATOMIC_ACQUIRE);
    if (ok + bad != task.slice_count) {
        TaskRef ref{};
        bool mapped;
        {
            std::lock_guard<std::mutex> g(mu_);
            auto it = tasks_.find(&task);
            mapped = it != tasks_.end();
            if (mapped) ref = it->second;
        }
        if (mapped) {
            pxn_task_status st{};
            int rc = lib_.get_status(lib_.handle, ref.batch, ref.index, &st);
            if (rc != PXN_OK) {
                // libpxn may still work on the batch: it is neither freed
                // nor reported final here. MultiTransport's slice timeout,
                // or close, ends the task.
                LOG_EVERY_N(WARNING, 1000)
                    << "pxn_get_status: " << lib_.lastError();
                out.s = TransferStatusEnum::WAITING;
                out.transferred_bytes = task.transferred_bytes;
                return;
            }
            if (!isFinal(st.state)) {
                out.s = TransferStatusEnum::WAITING;
                out.transferred_bytes = st.transferred;
                return;
            }
            finalize(task, s, st.state, st.transferred);
        }
        ok = __atomic_load_n(&task.success_slice_count, __ATOMIC_ACQUIRE);
        bad = __atomic_load_n(&task.failed_slice_count, __ATOMIC_ACQUIRE);
    }
    out.transferred_bytes = task.transferred_bytes;
    if (ok + bad != task.slice_count) {
        out.s = TransferStatusEnum::WAITING;
        return;
    }
    if (bad == 0)
        out.s = TransferStatusEnum::COMPLETED;
    else if (s.rdma.retry_cnt == kTimedOutMark)
        out.s = TransferStatusEnum::TIMEOUT;
    else
        out.s = TransferStatusEnum::FAILED;
    task.is_finished = true;
}

}  // namespace pxn
}  // namespace mooncake
