// SPDX-License-Identifier: Apache-2.0

#include "pxn_memory_index.h"

#include <mutex>

namespace mooncake {
namespace pxn {

void DeviceMemoryIndex::add(uintptr_t start, size_t length) {
    std::unique_lock<std::shared_mutex> g(mu_);
    ranges_[start] = start + length;
}

void DeviceMemoryIndex::remove(uintptr_t start) {
    std::unique_lock<std::shared_mutex> g(mu_);
    ranges_.erase(start);
}

bool DeviceMemoryIndex::holds(const void *p, size_t len) const {
    auto a = reinterpret_cast<uintptr_t>(p);
    std::shared_lock<std::shared_mutex> g(mu_);
    auto it = ranges_.upper_bound(a);
    if (it == ranges_.begin()) return false;
    --it;
    return a >= it->first && a < it->second && len <= it->second - a;
}

}  // namespace pxn
}  // namespace mooncake
