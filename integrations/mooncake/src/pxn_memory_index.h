// SPDX-License-Identifier: Apache-2.0

// The GPU memory this process registered with the transport.
#ifndef PXN_MOONCAKE_PXN_MEMORY_INDEX_H
#define PXN_MOONCAKE_PXN_MEMORY_INDEX_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <shared_mutex>

namespace mooncake {
namespace pxn {

// Registered device ranges by start address; a write whose source lies
// wholly inside one of them may go to libpxn.
class DeviceMemoryIndex {
   public:
    void add(uintptr_t start, size_t length);
    void remove(uintptr_t start);
    // Whether [p, p+len) lies inside one registered range.
    bool holds(const void *p, size_t len) const;

   private:
    mutable std::shared_mutex mu_;
    std::map<uintptr_t, uintptr_t> ranges_;  // start -> end
};

}  // namespace pxn
}  // namespace mooncake

#endif
