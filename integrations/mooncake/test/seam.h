// SPDX-License-Identifier: Apache-2.0

// The link seam's controls: a test implementation of what Mooncake's
// rdma_transport.cpp provides (rdma_seam.cpp) and, for the test program, of
// transfer_metadata.cpp, topology.cpp, config.cpp and status.cpp
// (mooncake_stubs.cpp), with an emulated NIC that records every post and
// completes it by copying the bytes into the target's memory.
#ifndef PXN_MOONCAKE_TEST_SEAM_H
#define PXN_MOONCAKE_TEST_SEAM_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace seam {

using mooncake::Transport;

// One slice RdmaTransport::submitTransferTask posted, as the NIC saw it.
struct Post {
    const Transport::TransferTask *task;
    int opcode;
    uint64_t source;
    uint64_t length;
    uint64_t target_id;
    uint64_t dst;
    uint32_t lkey;
    uint32_t rkey;
    // Posted through submitPreparedSlices, to this peer NIC path.
    bool prepared;
    std::string peer_nic_path;
    // The target segment's name.
    std::string target;

    bool sameWork(const Post &o) const {
        return opcode == o.opcode && source == o.source &&
               length == o.length && target_id == o.target_id &&
               dst == o.dst && lkey == o.lkey && rkey == o.rkey;
    }
};

// One registerLocalMemory call that reached RdmaTransport.
struct Registration {
    uint64_t addr;
    uint64_t length;
    std::string location;
    bool remote_accessible;
    bool update_metadata;
    uint32_t lkey;
    bool live;
};

// Where the NIC writes for segment id: the buffer at base is mem.
void mapTarget(uint64_t segment_id, uint64_t base, void *mem, size_t len);

// Copies for the NIC; memcpy unless set (a CUDA copy on a GPU machine).
using CopyFn = int (*)(void *dst, const void *src, size_t n);
void setCopy(CopyFn fn);

std::vector<Post> posts();
std::vector<Registration> registrations();

// While held, posted slices wait; release completes the slices of the
// oldest n tasks waiting (all when n is 0, which ends the hold). held counts
// the tasks waiting: a relayed Piece is one task, whatever its slices.
void hold();
void release(size_t n);
size_t held();

// Slices to segment id fail instead of writing.
void failTarget(uint64_t segment_id, bool fail);

// Slices to segment id whose remote key is not rkey fail, as a NIC's remote
// access error (0: any key).
void setTargetKey(uint64_t segment_id, uint32_t rkey);

// What the seam's stand-ins were asked, and heap allocations made through
// operator new outside the seam's own bookkeeping and threads marked Quiet.
struct Counts {
    uint64_t allocate_batch;   // Transport::allocateBatchID
    uint64_t segment_lookups;  // TransferMetadata::getSegmentDescByID
    uint64_t select_device;    // per-slice device and key selection
    uint64_t prepared_calls;   // RdmaTransport::submitPreparedSlices
    uint64_t prepared_slices;
    uint64_t allocations;
};
Counts counts();

// While one lives, operator new on this thread is not counted.
struct Quiet {
    Quiet();
    ~Quiet();
    Quiet(const Quiet &) = delete;
    Quiet &operator=(const Quiet &) = delete;
};

// Between the seam's files: what the stand-ins count.
void noteSegmentLookup();
void noteAllocation();
void noteAllocateBatch();

}  // namespace seam

#endif
