// SPDX-License-Identifier: Apache-2.0

#include "pxn_segment_cache.h"

#include <algorithm>

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
        v.hcas.clear();
        for (const auto &kv : desc->topology.getMatrix()) {
            const auto &e = kv.second;
            v.hcas[kv.first] =
                e.preferred_hca.empty() ? e.avail_hca : e.preferred_hca;
        }
        names_[desc->name] = id;
    }
    return v;
}

bool SegmentCache::target(SegmentID id,
                          const std::shared_ptr<SegmentDesc> &desc,
                          uint64_t dst, uint64_t len, Target &out) {
    std::lock_guard<std::mutex> g(mu_);
    auto &v = viewOf(id, desc);
    for (const auto &b : desc->buffers) {
#ifdef ENABLE_MULTI_PROTOCOL
        if (!b.protocol.empty() && b.protocol != "rdma") continue;
#endif
        if (b.rkey.empty() || dst < b.addr || dst - b.addr >= b.length ||
            len > b.length - (dst - b.addr))
            continue;
        auto it = v.hcas.find(b.name);
        if (it == v.hcas.end()) it = v.hcas.find(kWildcardLocation);
        if (it == v.hcas.end() || it->second.empty()) return false;
        out.hca_count = static_cast<uint32_t>(it->second.size());
        out.hca = it->second[0];
        out.base = b.addr;
        out.length = b.length;
        const auto &list = desc->topology.getHcaList();
        auto pos = std::find(list.begin(), list.end(), out.hca);
        size_t idx = static_cast<size_t>(pos - list.begin());
        if (pos == list.end() || idx >= b.rkey.size()) return false;
        out.rkey = b.rkey[idx];
        out.device = idx;
        return true;
    }
    return false;
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
