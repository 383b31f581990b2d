// SPDX-License-Identifier: Apache-2.0

// Names and helpers the parts of PxnRdmaTransport share.
#ifndef PXN_MOONCAKE_PXN_COMMON_H
#define PXN_MOONCAKE_PXN_COMMON_H

#include <cstdint>
#include <string>
#include <vector>

#include "pxn.h"
#include "transport/rdma_transport/rdma_transport.h"

namespace mooncake {
namespace pxn {

using Slice = Transport::Slice;
using TransferTask = Transport::TransferTask;
using SegmentDesc = TransferMetadata::SegmentDesc;
using BufferDesc = TransferMetadata::BufferDesc;

// A completion for libpxn's poll: token's op or Piece ended with code, and
// msg says why when it failed.
pxn_transport_completion completion(uint64_t token, int code,
                                    const std::string &msg);

// Whether a slice of slices was posted longer than MultiTransport's slice
// timeout ago: a task's (per-op path) or a Piece's.
bool slicesTimedOut(const std::vector<Slice *> &slices);

}  // namespace pxn
}  // namespace mooncake

#endif
