// SPDX-License-Identifier: Apache-2.0

// What the transport reads from outside its own code: its MC_PXN_*
// switches and the segment descriptor a peer published through Mooncake's
// metadata. Pure functions over standard types, so that they build and are
// fuzzed without Mooncake.
#ifndef PXN_MOONCAKE_PXN_PARSE_H
#define PXN_MOONCAKE_PXN_PARSE_H

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "pxn.h"

namespace mooncake {
namespace pxn {

// A switch's state and, when its value is not one the documentation
// lists, a note naming the value and the state it gave.
struct Switch {
    bool on = false;
    std::string note;
};

// MC_PXN_ENABLE: "1" on; unset, empty or "0" off; anything else off.
Switch enableSwitch(const char *value);

// MC_PXN_SUBMIT_PIECE: "0" off; unset, empty or "1" on; anything else on.
Switch submitPieceSwitch(const char *value);

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

// The NICs that serve each location of a segment, by location name.
using LocationHcas =
    std::unordered_map<std::string, std::vector<std::string>>;

// A location's serving NICs out of a segment's topology matrix (location
// name to an entry with preferred_hca and avail_hca): the preferred ones,
// else the available ones.
template <class Matrix>
LocationHcas locationHcas(const Matrix &matrix) {
    LocationHcas out;
    for (const auto &kv : matrix) {
        const auto &e = kv.second;
        out[kv.first] = e.preferred_hca.empty() ? e.avail_hca : e.preferred_hca;
    }
    return out;
}

// Whether [dst, dst+len) lies in the buffer [base, base+length) with dst
// inside it; no sum is formed, so nothing wraps.
inline bool bufferHolds(uint64_t base, uint64_t length, uint64_t dst,
                        uint64_t len) {
    return dst >= base && dst - base < length && len <= length - (dst - base);
}

// The target of [dst, dst+len) in a segment's buffers (each with name,
// addr, length, rkey: one key per entry of hca_list, and under
// ENABLE_MULTI_PROTOCOL protocol): the first buffer holding the range that
// has keys decides. It is served by its location's NICs (wildcard's when
// its location has no entry), the first of which must be in hca_list with a
// key; false otherwise.
template <class Buffer>
bool findTarget(const std::vector<Buffer> &buffers, const LocationHcas &hcas,
                const std::vector<std::string> &hca_list,
                const std::string &wildcard, uint64_t dst, uint64_t len,
                Target &out) {
    for (const auto &b : buffers) {
#ifdef ENABLE_MULTI_PROTOCOL
        if (!b.protocol.empty() && b.protocol != "rdma") continue;
#endif
        if (b.rkey.empty() || !bufferHolds(b.addr, b.length, dst, len))
            continue;
        auto it = hcas.find(b.name);
        if (it == hcas.end()) it = hcas.find(wildcard);
        if (it == hcas.end() || it->second.empty()) return false;
        out.hca_count = static_cast<uint32_t>(it->second.size());
        out.hca = it->second[0];
        out.base = b.addr;
        out.length = b.length;
        auto pos = std::find(hca_list.begin(), hca_list.end(), out.hca);
        size_t idx = static_cast<size_t>(pos - hca_list.begin());
        if (pos == hca_list.end() || idx >= b.rkey.size()) return false;
        out.rkey = b.rkey[idx];
        out.device = idx;
        return true;
    }
    return false;
}

// Whether a segment's name can stand for its session in a pxn_request.
inline bool sessionNameFits(const std::string &name) {
    return !name.empty() && name.size() <= PXN_MAX_SESSION;
}

// Fills libpxn's answer to a resolve from t and route; PXN_EINVAL, with out
// untouched, when t's NIC name does not fit pxn_target_info.hca.
int targetInfo(const Target &t, uint64_t route, pxn_target_info &out);

}  // namespace pxn
}  // namespace mooncake

#endif
