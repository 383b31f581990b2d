// SPDX-License-Identifier: Apache-2.0

#include "pxn_parse.h"

#include <cstdio>
#include <cstring>

namespace mooncake {
namespace pxn {

namespace {

// Longest part of a value a note quotes.
constexpr size_t kQuotedMax = 64;

// value in double quotes, bytes outside printable ASCII (and the quote and
// backslash) escaped as \xNN, cut after kQuotedMax bytes with "...".
std::string quoted(const char *value) {
    std::string q = "\"";
    size_t n = 0;
    for (const char *p = value; *p != '\0'; p++, n++) {
        if (n == kQuotedMax) {
            q += "...";
            break;
        }
        auto c = static_cast<unsigned char>(*p);
        if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') {
            char esc[5];
            std::snprintf(esc, sizeof esc, "\\x%02x", c);
            q += esc;
        } else {
            q += static_cast<char>(c);
        }
    }
    return q + "\"";
}

// The switch named name: off for "0", on for "1", dflt when unset or empty,
// and dflt with a note for anything else.
Switch readSwitch(const char *name, const char *value, bool dflt) {
    Switch s;
    s.on = dflt;
    if (value == nullptr || value[0] == '\0') return s;
    if (std::strcmp(value, "0") == 0) {
        s.on = false;
    } else if (std::strcmp(value, "1") == 0) {
        s.on = true;
    } else {
        s.note = std::string(name) + "=" + quoted(value) +
                 " is neither 0 nor 1; taken as " + (dflt ? "1" : "0");
    }
    return s;
}

}  // namespace

Switch enableSwitch(const char *value) {
    return readSwitch("MC_PXN_ENABLE", value, false);
}

Switch submitPieceSwitch(const char *value) {
    return readSwitch("MC_PXN_SUBMIT_PIECE", value, true);
}

int targetInfo(const Target &t, uint64_t route, pxn_target_info &out) {
    if (t.hca.size() >= PXN_HCA_NAME_MAX) return PXN_EINVAL;
    out.hca_count = t.hca_count;
    std::memcpy(out.hca, t.hca.c_str(), t.hca.size() + 1);
    out.range_base = t.base;
    out.range_len = t.length;
    out.route = route;
    out.remote_key = t.rkey;
    return PXN_OK;
}

}  // namespace pxn
}  // namespace mooncake
