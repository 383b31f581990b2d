// SPDX-License-Identifier: Apache-2.0

// What the test program links in place of Mooncake's config.cpp,
// status.cpp, topology.cpp and transfer_metadata.cpp. A build of Mooncake's
// Python module against the seam links Mooncake's own instead, and only
// rdma_seam.cpp.
#include <algorithm>
#include <cstring>

#include "config.h"
#include "seam.h"
#include "topology.h"
#include "transfer_metadata.h"

namespace mooncake {

// config.cpp

GlobalConfig &globalConfig() {
    static GlobalConfig config;
    return config;
}

// status.cpp

Status::Status(Code code, std::string_view message) : code_(code) {
    if (code == Code::kOk) return;
    char *m = new char[message.size() + 1];
    std::memcpy(m, message.data(), message.size());
    m[message.size()] = '\0';
    message_ = m;
}

const char *Status::CopyMessage(const char *msg) {
    size_t n = std::strlen(msg);
    char *m = new char[n + 1];
    std::memcpy(m, msg, n + 1);
    return m;
}

std::string Status::ToString() const {
    if (ok()) return "OK";
    return "code " + std::to_string(static_cast<int>(code_)) + ": " +
           std::string(message());
}

// topology.cpp: parse takes {"location": [[preferred...], [available...]]};
// the HCA list is every HCA named, in order of first appearance.

Topology::Topology() : use_round_robin_(false) {}

Topology::~Topology() {}

bool Topology::empty() const { return matrix_.empty(); }

int Topology::parse(const std::string &topology_json) {
    Json::Value root;
    Json::Reader reader;
    if (!reader.parse(topology_json, root) || !root.isObject()) return -1;
    matrix_.clear();
    hca_list_.clear();
    auto note = [&](const std::string &hca) {
        if (std::find(hca_list_.begin(), hca_list_.end(), hca) ==
            hca_list_.end())
            hca_list_.push_back(hca);
    };
    for (const auto &loc : root.getMemberNames()) {
        TopologyEntry e;
        e.name = loc;
        const auto &v = root[loc];
        for (const auto &h : v[0]) {
            e.preferred_hca.push_back(h.asString());
            note(h.asString());
        }
        for (const auto &h : v[1]) {
            e.avail_hca.push_back(h.asString());
            note(h.asString());
        }
        matrix_[loc] = e;
    }
    return 0;
}

// transfer_metadata.cpp: a local cache only; nothing is fetched.

TransferMetadata::TransferMetadata(const std::string &) : next_segment_id_(1) {}

TransferMetadata::~TransferMetadata() {}

std::shared_ptr<TransferMetadata::SegmentDesc>
TransferMetadata::getSegmentDescByID(SegmentID segment_id, bool) {
    seam::noteSegmentLookup();
    RWSpinlock::ReadGuard g(segment_lock_);
    auto it = segment_id_to_desc_map_.find(segment_id);
    return it == segment_id_to_desc_map_.end() ? nullptr : it->second;
}

std::shared_ptr<TransferMetadata::SegmentDesc>
TransferMetadata::getSegmentDescByName(const std::string &segment_name, bool) {
    RWSpinlock::ReadGuard g(segment_lock_);
    auto it = segment_name_to_id_map_.find(segment_name);
    if (it == segment_name_to_id_map_.end()) return nullptr;
    auto d = segment_id_to_desc_map_.find(it->second);
    return d == segment_id_to_desc_map_.end() ? nullptr : d->second;
}

TransferMetadata::SegmentID TransferMetadata::getSegmentID(
    const std::string &segment_name) {
    RWSpinlock::ReadGuard g(segment_lock_);
    auto it = segment_name_to_id_map_.find(segment_name);
    return it == segment_name_to_id_map_.end() ? static_cast<SegmentID>(-1)
                                               : it->second;
}

int TransferMetadata::addLocalSegment(SegmentID segment_id,
                                      const std::string &segment_name,
                                      std::shared_ptr<SegmentDesc> &&desc) {
    RWSpinlock::WriteGuard g(segment_lock_);
    segment_id_to_desc_map_[segment_id] = std::move(desc);
    segment_name_to_id_map_[segment_name] = segment_id;
    return 0;
}

int TransferMetadata::addLocalMemoryBuffer(const BufferDesc &buffer_desc,
                                           bool) {
    RWSpinlock::WriteGuard g(segment_lock_);
    auto &cur = segment_id_to_desc_map_[LOCAL_SEGMENT_ID];
    auto next = std::make_shared<SegmentDesc>(*cur);
    next->buffers.push_back(buffer_desc);
    cur = next;
    return 0;
}

int TransferMetadata::removeLocalMemoryBuffer(void *addr, bool) {
    RWSpinlock::WriteGuard g(segment_lock_);
    auto &cur = segment_id_to_desc_map_[LOCAL_SEGMENT_ID];
    auto next = std::make_shared<SegmentDesc>(*cur);
    auto &bs = next->buffers;
    auto n = bs.size();
    bs.erase(std::remove_if(bs.begin(), bs.end(),
                            [&](const BufferDesc &b) {
                                return b.addr ==
                                       reinterpret_cast<uint64_t>(addr);
                            }),
             bs.end());
    if (bs.size() == n) return ERR_ADDRESS_NOT_REGISTERED;
    cur = next;
    return 0;
}
int TransferMetadata::startHandshakeDaemon(OnReceiveHandShake, uint16_t,
                                           int) {
    return 0;
}

int TransferMetadata::updateLocalSegmentDesc(SegmentID) { return 0; }

}  // namespace mooncake
