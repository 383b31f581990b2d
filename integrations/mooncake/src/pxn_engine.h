// SPDX-License-Identifier: Apache-2.0

// The PXN side of PxnRdmaTransport: libpxn opened on this process's one NIC,
// its callbacks into RDMA, and the parts that each own one concern.
#ifndef PXN_MOONCAKE_PXN_ENGINE_H
#define PXN_MOONCAKE_PXN_ENGINE_H

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "pxn_api.h"
#include "pxn_common.h"
#include "pxn_memory_index.h"
#include "pxn_op_path.h"
#include "pxn_piece_path.h"
#include "pxn_rdma_transport.h"
#include "pxn_segment_cache.h"
#include "pxn_task_path.h"

namespace mooncake {

struct PxnRdmaTransport::Engine {
    explicit Engine(PxnRdmaTransport &o);

    // Opens libpxn, or returns null and says why in why.
    static std::unique_ptr<Engine> open(PxnRdmaTransport &owner,
                                        const std::shared_ptr<Topology> &topo,
                                        std::string &why);

    // Closes libpxn (a drain of up to 5 s; when the host's transport still
    // holds second-hop ops, libpxn keeps its arena registered and allocated
    // until the process exits), fails for Mooncake the tasks libpxn still
    // had, and frees the internal batches RDMA has finished. A later call
    // frees those RDMA finished since.
    void close();

    // Memory registered with the transport: device memory is offered to
    // libpxn, and writes from it may go there.
    void noteMemory(void *addr, size_t length, const std::string &location);
    void forgetMemory(void *addr);

    // Hands the tasks of in that libpxn takes to libpxn, and appends the
    // others to direct.
    void route(const std::vector<pxn::TransferTask *> &in,
               std::vector<pxn::TransferTask *> &direct);

    PxnRdmaTransport &owner;
    pxn::Libpxn lib;
    std::string local_hca;
    // local_hca's index among RDMA's devices: the topology holds it alone.
    const size_t local_hca_index = 0;
    pxn_transport table{};
    // Set by the arena registration callback during pxn_open.
    bool arena_offered = false;
    // Set by close: libpxn is gone and every request goes to RdmaTransport.
    std::atomic<bool> closed{false};

    pxn::DeviceMemoryIndex device_memory;
    pxn::SegmentCache segments;
    pxn::TaskPath tasks;
    pxn::OpPath ops;
    pxn::PiecePath pieces;

   private:
    bool eligible(const pxn::TransferTask &t, pxn_request &r,
                  std::shared_ptr<pxn::SegmentDesc> &desc);

    static pxn::Slice *allocateSlice();

    // Callbacks from libpxn; user is the Engine.
    static int resolveCb(void *user, const char *session, uint64_t dst,
                         pxn_target_info *out);
    static int registerArenaCb(void *user, void *addr, uint64_t len, int kind,
                               uint64_t *local_key);
    static int deregisterArenaCb(void *user, void *addr, uint64_t, uint64_t);
    static int submitCb(void *user, const pxn_transport_op *ops, size_t count);
    static size_t pollCb(void *user, pxn_transport_completion *out,
                         size_t capacity);
    static int submitPieceCb(void *user, const pxn_transport_op *ops,
                             size_t count, uint64_t token);
};

}  // namespace mooncake

#endif
