// SPDX-License-Identifier: Apache-2.0

// PxnRdmaTransport: Mooncake's RDMA transport with PXN's rail-aligned relay
// for cross-rail writes from GPU memory. docs/integration-mooncake.md is the
// reference.
#ifndef PXN_MOONCAKE_PXN_RDMA_TRANSPORT_H
#define PXN_MOONCAKE_PXN_RDMA_TRANSPORT_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/rdma_transport/rdma_transport.h"

namespace mooncake {

// A drop-in RdmaTransport. It keeps the name "rdma", so MultiTransport routes
// to it whatever the target segment advertises. Without MC_PXN_ENABLE=1 it
// never loads libpxn and every call is RdmaTransport's own.
//
// With PXN on, a write whose source is registered GPU memory and whose
// destination buffer is served by exactly one NIC other than this process's
// one NIC goes to libpxn; every other request goes to RdmaTransport
// unchanged. libpxn calls back into RdmaTransport for everything it posts:
// the direct part of its work, fallbacks, and the second hop of writes this
// process relays for its peers, whose source is the staging arena registered
// here with remote_accessible=false.
class PxnRdmaTransport : public RdmaTransport {
   public:
    PxnRdmaTransport();
    ~PxnRdmaTransport() override;

    // MC_PXN_ENABLE=1: what MultiTransport's factory asks before choosing
    // this transport over RdmaTransport.
    static bool enabled();

    // Where this transport and the engine it is linked into disagree on a
    // shared struct's size or field offset (pxn_layout.h), said as the first
    // difference; empty when they agree. install fails unless it is empty.
    static std::string layoutMismatch();

    int install(std::string &local_server_name,
                std::shared_ptr<TransferMetadata> meta,
                std::shared_ptr<Topology> topo) override;

    int registerLocalMemory(void *addr, size_t length,
                            const std::string &location, bool remote_accessible,
                            bool update_metadata) override;

    int unregisterLocalMemory(void *addr, bool update_metadata = true) override;

    int registerLocalMemoryBatch(const std::vector<BufferEntry> &buffer_list,
                                 const std::string &location) override;

    int unregisterLocalMemoryBatch(
        const std::vector<void *> &addr_list) override;

    Status submitTransferTask(
        const std::vector<TransferTask *> &task_list) override;

    Status getTransferStatus(BatchID batch_id, size_t task_id,
                             TransferStatus &status) override;

    Status getTransferStatus(BatchID batch_id,
                             std::vector<TransferStatus> &status);

    // Closes the PXN side now; later requests all go to RdmaTransport.
    // libpxn drains for up to 5 s; tasks it still had end FAILED; its
    // staging arena stays registered and allocated until the process exits
    // when RDMA still holds work requests that read it. Internal batches
    // RDMA still holds are kept (pxnStats().op_batches) and freed by a
    // later call once RDMA has finished them. The destructor calls it.
    void pxnClose();

    // What the PXN side holds and has done; all zero with PXN off.
    struct PxnStats {
        // PXN is on and not closed.
        bool active = false;
        // Tasks handed to libpxn and not yet reported final.
        uint64_t tasks = 0;
        // libpxn batches not yet freed.
        uint64_t pxn_batches = 0;
        // Internal batches of ops libpxn handed to RdmaTransport, and
        // relayed Pieces RDMA still holds.
        uint64_t op_batches = 0;
        // Relayed Pieces taken whole (submit_piece), and the Piece path's
        // route cache: lookups it made, and routes it dropped (a failed or
        // timed-out slice, a key that changed).
        uint64_t pieces = 0;
        uint64_t route_misses = 0;
        uint64_t route_drops = 0;
        // The Piece path's pool: slots made (each an internal batch made
        // once), and times a slot grew to carry a Piece of more slices or
        // ops than it had carried.
        uint64_t piece_slots = 0;
        uint64_t piece_slot_grows = 0;
        // libpxn's counters (pxn_counters).
        uint64_t relayed_bytes = 0;
        uint64_t relayed_pieces = 0;
        uint64_t fallback_bytes = 0;
        uint64_t fallback_pieces = 0;
        uint64_t direct_bytes = 0;
        uint64_t forwarded_bytes = 0;
        uint64_t forwarded_pieces = 0;
        uint64_t second_hop_failures = 0;
        uint64_t copier = 0;
        uint64_t live_batches = 0;
    };
    PxnStats pxnStats() const;

    // Waits up to timeout_ms for a live relay on the canonical rail; false
    // when none came or PXN is off. For start-up barriers and tests.
    bool pxnWaitRelay(const std::string &rail, uint32_t timeout_ms);

    // Why PXN is off although MC_PXN_ENABLE=1 asked for it; empty otherwise.
    const std::string &pxnOffReason() const { return pxn_off_reason_; }

    struct Engine;

   private:
    std::unique_ptr<Engine> pxn_;
    std::string pxn_off_reason_;
};

}  // namespace mooncake

#endif
