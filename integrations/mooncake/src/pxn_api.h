// SPDX-License-Identifier: Apache-2.0

// libpxn as the transport loads it.
#ifndef PXN_MOONCAKE_PXN_API_H
#define PXN_MOONCAKE_PXN_API_H

#include <string>

#include "pxn.h"

#ifndef PXN_LIBRARY
#define PXN_LIBRARY "libpxn.so"
#endif

namespace mooncake {
namespace pxn {

// libpxn, loaded only when MC_PXN_ENABLE=1: a Go shared library starts its
// runtime's threads when it is loaded. It is never unloaded. handle is the
// engine opened in it, 0 until then.
struct Libpxn {
    decltype(&::pxn_api_version) api_version = nullptr;
    decltype(&::pxn_open) open = nullptr;
    decltype(&::pxn_close) close = nullptr;
    decltype(&::pxn_register_memory) register_memory = nullptr;
    decltype(&::pxn_submit) submit = nullptr;
    decltype(&::pxn_get_status) get_status = nullptr;
    decltype(&::pxn_free_batch) free_batch = nullptr;
    decltype(&::pxn_get_counters) get_counters = nullptr;
    decltype(&::pxn_is_active) is_active = nullptr;
    decltype(&::pxn_wait_relay) wait_relay = nullptr;
    decltype(&::pxn_last_error) last_error = nullptr;

    pxn_engine_t handle = 0;

    // Loads the library and its symbols, and checks its API version; false,
    // saying why in why, when any of that fails.
    bool load(std::string &why);

    // pxn_last_error of the calling thread.
    std::string lastError() const;
};

}  // namespace pxn
}  // namespace mooncake

#endif
