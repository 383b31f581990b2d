// SPDX-License-Identifier: Apache-2.0

#include "pxn_rdma_transport.h"

#include <glog/logging.h>

#include <cstdlib>

#include "pxn_engine.h"
#include "pxn_layout.h"
#include "pxn_parse.h"

// The transport's view of the structs it shares with the engine.
PXN_MOONCAKE_DEFINE_LAYOUT(pxn_mooncake_transport_layout)

namespace mooncake {

namespace {

bool pxnRequested() {
    return pxn::enableSwitch(std::getenv("MC_PXN_ENABLE")).on;
}

}  // namespace

PxnRdmaTransport::PxnRdmaTransport() = default;

bool PxnRdmaTransport::enabled() {
    pxn::Switch s = pxn::enableSwitch(std::getenv("MC_PXN_ENABLE"));
    if (!s.note.empty()) LOG(WARNING) << s.note;
    return s.on;
}

std::string PxnRdmaTransport::layoutMismatch() {
    const pxn_layout_field *engine, *mine;
    size_t ne = pxn_mooncake_engine_layout(&engine);
    size_t nm = pxn_mooncake_transport_layout(&mine);
    return pxnLayoutMismatch(engine, ne, mine, nm);
}

PxnRdmaTransport::~PxnRdmaTransport() {
    // libpxn drains through RdmaTransport, which must still be whole.
    pxnClose();
    pxn_.reset();
}

void PxnRdmaTransport::pxnClose() {
    if (pxn_) pxn_->close();
}

int PxnRdmaTransport::install(std::string &local_server_name,
                              std::shared_ptr<TransferMetadata> meta,
                              std::shared_ptr<Topology> topo) {
    std::string skew = layoutMismatch();
    if (!skew.empty()) {
        LOG(ERROR) << "PxnRdmaTransport was compiled with other Mooncake "
                      "struct layouts than the engine (engine first): "
                   << skew
                   << "; build it inside Mooncake's tree with the PXN patch";
        return ERR_INVALID_ARGUMENT;
    }
    int rc = RdmaTransport::install(local_server_name, meta, topo);
    if (rc != 0 || !pxnRequested()) return rc;
    std::string why = "no topology";
    if (topo != nullptr) pxn_ = Engine::open(*this, topo, why);
    if (!pxn_) {
        pxn_off_reason_ = why;
        LOG(WARNING) << "PXN off, RDMA carries every request: " << why;
    }
    return 0;
}
int PxnRdmaTransport::registerLocalMemory(void *addr, size_t length,
                                          const std::string &location,
                                          bool remote_accessible,
                                          bool update_metadata) {
    int rc = RdmaTransport::registerLocalMemory(addr, length, location,
                                                remote_accessible,
                                                update_metadata);
    if (rc == 0 && pxn_) pxn_->noteMemory(addr, length, location);
    return rc;
}

int PxnRdmaTransport::unregisterLocalMemory(void *addr, bool update_metadata) {
    if (pxn_) pxn_->forgetMemory(addr);
    return RdmaTransport::unregisterLocalMemory(addr, update_metadata);
}

int PxnRdmaTransport::registerLocalMemoryBatch(
    const std::vector<BufferEntry> &buffer_list, const std::string &location) {
    int rc = RdmaTransport::registerLocalMemoryBatch(buffer_list, location);
    if (rc == 0 && pxn_)
        for (const auto &b : buffer_list)
            pxn_->noteMemory(b.addr, b.length, location);
    return rc;
}

int PxnRdmaTransport::unregisterLocalMemoryBatch(
    const std::vector<void *> &addr_list) {
    if (pxn_)
        for (auto *a : addr_list) pxn_->forgetMemory(a);
    return RdmaTransport::unregisterLocalMemoryBatch(addr_list);
}

Status PxnRdmaTransport::submitTransferTask(
    const std::vector<TransferTask *> &task_list) {
    if (!pxn_ || pxn_->closed) return RdmaTransport::submitTransferTask(task_list);
    std::vector<TransferTask *> direct;
    direct.reserve(task_list.size());
    pxn_->route(task_list, direct);
    if (direct.empty()) return Status::OK();
    return RdmaTransport::submitTransferTask(direct);
}

Status PxnRdmaTransport::getTransferStatus(BatchID batch_id, size_t task_id,
                                           TransferStatus &status) {
    if (!pxn_) return RdmaTransport::getTransferStatus(batch_id, task_id, status);
    auto &bd = toBatchDesc(batch_id);
    if (task_id >= bd.task_list.size())
        return RdmaTransport::getTransferStatus(batch_id, task_id, status);
    auto &task = bd.task_list[task_id];
    Slice *s = pxn::TaskPath::sliceOf(task);
    if (s == nullptr)
        return RdmaTransport::getTransferStatus(batch_id, task_id, status);
    pxn_->tasks.status(task, *s, status);
    return Status::OK();
}

Status PxnRdmaTransport::getTransferStatus(
    BatchID batch_id, std::vector<TransferStatus> &status) {
    if (!pxn_) return RdmaTransport::getTransferStatus(batch_id, status);
    auto &bd = toBatchDesc(batch_id);
    status.resize(bd.task_list.size());
    for (size_t i = 0; i < bd.task_list.size(); i++) {
        Status s = getTransferStatus(batch_id, i, status[i]);
        if (!s.ok()) return s;
    }
    return Status::OK();
}

PxnRdmaTransport::PxnStats PxnRdmaTransport::pxnStats() const {
    PxnStats st;
    if (!pxn_) return st;
    auto &e = *pxn_;
    st.active = !e.closed;
    st.tasks = e.tasks.tasks();
    st.pxn_batches = e.tasks.batches();
    st.op_batches = e.ops.batches();
    pxn::PiecePath::Counts pc = e.pieces.counts();
    st.op_batches += pc.in_flight;
    st.piece_slots = pc.slots;
    st.piece_slot_grows = pc.slot_grows;
    st.pieces = pc.pieces;
    st.route_misses = pc.route_misses;
    st.route_drops = pc.route_drops;
    pxn_counters c{};
    c.struct_size = sizeof c;
    if (!e.closed && e.lib.get_counters(e.lib.handle, &c) == PXN_OK) {
        st.relayed_bytes = c.relayed_bytes;
        st.relayed_pieces = c.relayed_pieces;
        st.fallback_bytes = c.fallback_bytes;
        st.fallback_pieces = c.fallback_pieces;
        st.direct_bytes = c.direct_bytes;
        st.forwarded_bytes = c.forwarded_bytes;
        st.forwarded_pieces = c.forwarded_pieces;
        st.second_hop_failures = c.second_hop_failures;
        st.copier = c.copier;
        st.live_batches = c.live_batches;
    }
    return st;
}

bool PxnRdmaTransport::pxnWaitRelay(const std::string &rail,
                                    uint32_t timeout_ms) {
    if (!pxn_ || pxn_->closed) return false;
    return pxn_->lib.wait_relay(pxn_->lib.handle, rail.c_str(), timeout_ms) ==
           PXN_OK;
}

}  // namespace mooncake
