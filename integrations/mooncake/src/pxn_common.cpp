// SPDX-License-Identifier: Apache-2.0

#include "pxn_common.h"

#include <cstring>

#include "common.h"
#include "config.h"

namespace mooncake {
namespace pxn {

pxn_transport_completion completion(uint64_t token, int code,
                                    const std::string &msg) {
    pxn_transport_completion c{};
    c.token = token;
    c.status = code;
    std::strncpy(c.message, msg.c_str(), PXN_MESSAGE_MAX - 1);
    return c;
}

bool slicesTimedOut(const std::vector<Slice *> &slices) {
    if (globalConfig().slice_timeout <= 0) return false;
    int64_t now = getCurrentTimeInNano();
    int64_t limit = globalConfig().slice_timeout * 1000000000;
    for (const Slice *s : slices) {
        int64_t ts = s->ts;
        if (ts > 0 && now > ts && now - ts > limit) return true;
    }
    return false;
}

}  // namespace pxn
}  // namespace mooncake
