// SPDX-License-Identifier: Apache-2.0

#include "pxn_api.h"

#include <dlfcn.h>

namespace mooncake {
namespace pxn {

namespace {

template <typename F>
bool sym(void *lib, const char *name, F &out, std::string &why) {
    out = reinterpret_cast<F>(dlsym(lib, name));
    if (out == nullptr) why = std::string(PXN_LIBRARY ": no symbol ") + name;
    return out != nullptr;
}

}  // namespace

bool Libpxn::load(std::string &why) {
    void *lib = dlopen(PXN_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        const char *err = dlerror();
        why = std::string("cannot load " PXN_LIBRARY ": ") +
              (err ? err : "unknown error");
        return false;
    }
    if (!(sym(lib, "pxn_api_version", api_version, why) &&
          sym(lib, "pxn_open", open, why) &&
          sym(lib, "pxn_close", close, why) &&
          sym(lib, "pxn_register_memory", register_memory, why) &&
          sym(lib, "pxn_submit", submit, why) &&
          sym(lib, "pxn_get_status", get_status, why) &&
          sym(lib, "pxn_free_batch", free_batch, why) &&
          sym(lib, "pxn_get_counters", get_counters, why) &&
          sym(lib, "pxn_is_active", is_active, why) &&
          sym(lib, "pxn_wait_relay", wait_relay, why) &&
          sym(lib, "pxn_last_error", last_error, why)))
        return false;
    uint32_t v = api_version();
    if (v < PXN_API_VERSION) {
        why = std::string(PXN_LIBRARY " speaks API version ") +
              std::to_string(v) + ", this transport needs " +
              std::to_string(PXN_API_VERSION);
        return false;
    }
    return true;
}

std::string Libpxn::lastError() const {
    char buf[PXN_ERROR_MAX];
    last_error(buf, sizeof buf);
    return buf;
}

}  // namespace pxn
}  // namespace mooncake
