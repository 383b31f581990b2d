// SPDX-License-Identifier: Apache-2.0

// Segments as this process sees them through Mooncake's metadata.
#ifndef PXN_MOONCAKE_PXN_SEGMENT_CACHE_H
#define PXN_MOONCAKE_PXN_SEGMENT_CACHE_H

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "pxn_common.h"
#include "pxn_parse.h"

namespace mooncake {
namespace pxn {

// The NICs that serve each location of the segments targets were looked up
// in, kept per descriptor, and the segments' names. It reads descriptors
// through rdma's metadata.
class SegmentCache {
   public:
    explicit SegmentCache(RdmaTransport &rdma) : rdma_(rdma) {}

    // The descriptor Mooncake holds for id; null when none.
    std::shared_ptr<SegmentDesc> desc(SegmentID id);

    // Copies the local segment's buffer that starts at addr.
    bool localBuffer(void *addr, BufferDesc &out);

    // The buffer of desc (segment id) that holds [dst, dst+len) for RDMA,
    // and the NICs that serve it.
    bool target(SegmentID id, const std::shared_ptr<SegmentDesc> &desc,
                uint64_t dst, uint64_t len, Target &out);

    // The segment a target was looked up in under name.
    bool idOf(const char *name, SegmentID &id);

    // The segment named session and its descriptor, fetched from Mooncake
    // when this process has not seen it; false for none, or this process's
    // own.
    bool byName(const char *session, SegmentID &id,
                std::shared_ptr<SegmentDesc> &desc);

   private:
    struct View {
        std::shared_ptr<SegmentDesc> desc;
        LocationHcas hcas;
    };

    // mu_ held.
    View &viewOf(SegmentID id, const std::shared_ptr<SegmentDesc> &desc);

    RdmaTransport &rdma_;
    std::mutex mu_;
    std::unordered_map<SegmentID, View> views_;
    std::unordered_map<std::string, SegmentID> names_;
};

}  // namespace pxn
}  // namespace mooncake

#endif
