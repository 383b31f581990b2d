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

namespace mooncake {
namespace pxn {

// A destination as this process sees it: the buffer that holds it, the
// NICs that serve the buffer's location, and the remote key for the first
// of them.
struct Target {
    uint32_t hca_count = 0;
    std::string hca;
    uint64_t base = 0;
    uint64_t length = 0;
    uint64_t rkey = 0;
    // hca's index in the segment's HCA list: its device and key index.
    size_t device = 0;
};

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
        std::unordered_map<std::string, std::vector<std::string>> hcas;
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
