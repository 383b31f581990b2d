// SPDX-License-Identifier: Apache-2.0

// The test program's counts of heap allocations and of
// Transport::allocateBatchID calls (seam::counts).
#include <cstdlib>
#include <new>

#include "seam.h"
#include "transport/transport.h"

// The test program's heap allocations, counted (seam::counts); the aligned
// forms are left to the runtime, which pairs them among themselves.
void *operator new(size_t n) {
    seam::noteAllocation();
    if (void *p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}

void *operator new[](size_t n) { return operator new(n); }

void *operator new(size_t n, const std::nothrow_t &) noexcept {
    seam::noteAllocation();
    return std::malloc(n ? n : 1);
}

void *operator new[](size_t n, const std::nothrow_t &) noexcept {
    return operator new(n, std::nothrow);
}

void operator delete(void *p) noexcept { std::free(p); }

void operator delete[](void *p) noexcept { std::free(p); }

void operator delete(void *p, size_t) noexcept { std::free(p); }

void operator delete[](void *p, size_t) noexcept { std::free(p); }

void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }

void operator delete[](void *p, const std::nothrow_t &) noexcept { std::free(p); }

// Transport::allocateBatchID, wrapped at link time (-Wl,--wrap), counted.
extern "C" mooncake::Transport::BatchID
__real__ZN8mooncake9Transport15allocateBatchIDEm(mooncake::Transport *self,
                                                 size_t batch_size);

extern "C" mooncake::Transport::BatchID
__wrap__ZN8mooncake9Transport15allocateBatchIDEm(mooncake::Transport *self,
                                                 size_t batch_size) {
    seam::noteAllocateBatch();
    return __real__ZN8mooncake9Transport15allocateBatchIDEm(self, batch_size);
}
