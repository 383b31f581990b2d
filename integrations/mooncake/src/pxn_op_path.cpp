// SPDX-License-Identifier: Apache-2.0

#include "pxn_op_path.h"

#include <glog/logging.h>

#include <string>

namespace mooncake {
namespace pxn {

int OpPath::submit(const pxn_transport_op *ops, size_t count) {
    auto *ob = new OpBatch;
    ob->requests.reserve(count);
    ob->tokens.reserve(count);
    std::vector<pxn_transport_completion> no;
    for (size_t i = 0; i < count; i++) {
        const auto &op = ops[i];
        SegmentID id = 0;
        if (op.flags & PXN_OP_ROUTED) {
            // The route handle is the SegmentID resolve gave; Mooncake
            // never reuses one. The op is honoured only while the segment
            // still holds dst with the same remote key.
            auto desc = segments_.desc(op.route);
            Target t;
            if (!desc || !segments_.target(op.route, desc, op.dst, op.len, t) ||
                t.rkey != op.remote_key) {
                no.push_back(completion(op.token, PXN_ESTALE,
                                        "segment " + std::to_string(op.route) +
                                            " no longer holds the range"));
                continue;
            }
            id = op.route;
        } else if (!segments_.idOf(op.target, id)) {
            no.push_back(completion(op.token, PXN_EINVAL,
                                    std::string("unknown segment ") +
                                        op.target));
            continue;
        }
        TransferRequest r;
        r.opcode = op.read ? TransferRequest::READ : TransferRequest::WRITE;
        r.source = op.src;
        r.target_id = id;
        r.target_offset = op.dst;
        r.length = op.len;
        ob->requests.push_back(r);
        ob->tokens.push_back(op.token);
    }
    if (!no.empty()) {
        std::lock_guard<std::mutex> g(mu_);
        refused_.insert(refused_.end(), no.begin(), no.end());
    }
    size_t n = ob->requests.size();
    if (n == 0) {
        delete ob;
        return PXN_OK;
    }
    ob->id = rdma_.allocateBatchID(n);
    ob->state.assign(n, 0);
    ob->open = n;
    auto &bd = Transport::toBatchDesc(ob->id);
    std::vector<TransferTask *> list;
    list.reserve(n);
    for (size_t i = 0; i < n; i++) {
        auto &task = bd.task_list.emplace_back();
        task.batch_id = ob->id;
        task.request = &ob->requests[i];
        list.push_back(&task);
    }
    // A request RdmaTransport cannot post fails its task; poll reports it
    // like any failed write.
    Status s = rdma_.RdmaTransport::submitTransferTask(list);
    if (!s.ok()) {
        LOG_EVERY_N(WARNING, 1000)
            << "PXN: RDMA refused part of a submit: " << s.ToString();
    }
    std::lock_guard<std::mutex> g(mu_);
    live_.push_back(ob);
    return PXN_OK;
}

bool OpPath::finished(const OpBatch &ob) {
    auto &bd = Transport::toBatchDesc(ob.id);
    for (auto &t : bd.task_list)
        if (!t.is_finished) return false;
    return true;
}

size_t OpPath::reap(OpBatch &ob, pxn_transport_completion *out, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < ob.state.size(); i++) {
        if (ob.state[i] == 1) continue;
        TransferStatus st;
        rdma_.RdmaTransport::getTransferStatus(ob.id, i, st);
        bool done = st.s == TransferStatusEnum::COMPLETED ||
                    st.s == TransferStatusEnum::FAILED;
        if (out != nullptr && n == cap) continue;
        auto &task = Transport::toBatchDesc(ob.id).task_list[i];
        if (done) {
            // Also the final report of an op reported timed out before:
            // until this one, libpxn keeps the op's slot.
            if (out != nullptr)
                out[n] = st.s == TransferStatusEnum::COMPLETED
                             ? completion(ob.tokens[i], PXN_OK, "")
                             : completion(ob.tokens[i], PXN_EIO,
                                          "RDMA write failed");
            n++;
            ob.state[i] = 1;
            ob.open--;
        } else if (ob.state[i] == 0 && slicesTimedOut(task.slice_list)) {
            if (out != nullptr)
                out[n] = completion(ob.tokens[i], PXN_ETIMEDOUT,
                                    "RDMA slice timed out");
            n++;
            ob.state[i] = 2;
        }
    }
    return n;
}

size_t OpPath::reapBatches(pxn_transport_completion *out, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < live_.size();) {
        OpBatch *ob = live_[i];
        if (out != nullptr)
            n += reap(*ob, out + n, cap - n);
        else
            reap(*ob, nullptr, 0);
        if (ob->open == 0 && finished(*ob)) {
            rdma_.Transport::freeBatchID(ob->id);
            delete ob;
            live_[i] = live_.back();
            live_.pop_back();
            continue;
        }
        i++;
    }
    return n;
}

size_t OpPath::poll(pxn_transport_completion *out, size_t capacity) {
    std::lock_guard<std::mutex> g(mu_);
    size_t n = 0;
    while (n < capacity && !refused_.empty()) {
        out[n++] = refused_.back();
        refused_.pop_back();
    }
    return n + reapBatches(out + n, capacity - n);
}

size_t OpPath::sweep() {
    std::lock_guard<std::mutex> g(mu_);
    reapBatches(nullptr, 0);
    return live_.size();
}

size_t OpPath::batches() {
    std::lock_guard<std::mutex> g(mu_);
    return live_.size();
}

}  // namespace pxn
}  // namespace mooncake
