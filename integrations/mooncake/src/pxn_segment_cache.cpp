// SPDX-License-Identifier: Apache-2.0

#include "pxn_segment_cache.h"

#include "memory_location.h"

namespace mooncake {
namespace pxn {

std::shared_ptr<SegmentDesc> SegmentCache::desc(SegmentID id) {
    return rdma_.meta()->getSegmentDescByID(id);
}

bool SegmentCache::localBuffer(void *addr, BufferDesc &out) {
    auto local = rdma_.meta()->getSegmentDescByID(LOCAL_SEGMENT_ID);
    if (!local) return false;
    for (const auto &b : local->buffers) {
        if (b.addr != reinterpret_cast<uint64_t>(addr)) continue;
        out = b;
        return true;
    }
    return false;
}

SegmentCache::View &SegmentCache::viewOf(
    SegmentID id, const std::shared_ptr<SegmentDesc> &desc) {
    auto &v = views_[id];
    if (v.desc != desc) {
        v.desc = desc;
        v.hcas = locationHcas(desc->topology.getMatrix());
        names_[desc->name] = id;
    }
    return v;
}

bool SegmentCache::target(SegmentID id,
                          const std::shared_ptr<SegmentDesc> &desc,
                          uint64_t dst, uint64_t len, Target &out) {
    std::lock_guard<std::mutex> g(mu_);
    auto &v = viewOf(id, desc);
    return findTarget(desc->buffers, v.hcas, desc->topology.getHcaList(),
                      kWildcardLocation, dst, len, out);
}

bool SegmentCache::idOf(const char *name, SegmentID &id) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = names_.find(name);
    if (it == names_.end()) return false;
    id = it->second;
    return true;
}

bool SegmentCache::byName(const char *session, SegmentID &id,
                          std::shared_ptr<SegmentDesc> &desc) {
    if (!idOf(session, id)) id = static_cast<SegmentID>(-1);
    if (id != static_cast<SegmentID>(-1)) {
        desc = rdma_.meta()->getSegmentDescByID(id);
        if (desc) return true;
    }
    // A session this process has not opened: Mooncake fetches its
    // descriptor once; later Pieces find it in the cache above.
    desc = rdma_.meta()->getSegmentDescByName(session);
    if (!desc) return false;
    id = rdma_.meta()->getSegmentID(session);
    return id != static_cast<SegmentID>(-1) && id != LOCAL_SEGMENT_ID;
}

}  // namespace pxn
}  // namespace mooncake
