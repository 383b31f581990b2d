// SPDX-License-Identifier: Apache-2.0

// The fuzz harnesses' assertion: a property that does not hold aborts, which
// libFuzzer reports as a crash with the input that broke it.
#ifndef PXN_MOONCAKE_FUZZ_CHECK_H
#define PXN_MOONCAKE_FUZZ_CHECK_H

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, ...)                                          \
    do {                                                               \
        if (!(cond)) {                                                 \
            std::fprintf(stderr, "%s:%d: %s does not hold: ", __FILE__, \
                         __LINE__, #cond);                             \
            std::fprintf(stderr, __VA_ARGS__);                         \
            std::fputc('\n', stderr);                                  \
            std::abort();                                              \
        }                                                              \
    } while (0)

#endif
