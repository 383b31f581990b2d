// SPDX-License-Identifier: Apache-2.0

// The transport's MC_PXN_* switches, read from the process's environment
// (set by whoever starts it: the device plugin, a launcher): the input is
// the value. Documented values give their state silently; any other value
// gives the switch's default and a note that names the value, in printable
// ASCII, from which the value's first bytes decode again.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_check.h"
#include "pxn_parse.h"

using mooncake::pxn::Switch;

namespace {

constexpr size_t kQuotedMax = 64;

// What a note quotes from from on, its escapes undone.
bool unquote(const std::string &note, size_t from, std::string &value) {
    if (from >= note.size() || note[from] != '"') return false;
    size_t i = from + 1;
    value.clear();
    while (i < note.size()) {
        char c = note[i];
        if (c == '"') return true;
        if (c == '\\') {
            if (i + 3 >= note.size() || note[i + 1] != 'x') return false;
            value += static_cast<char>(
                std::stoi(note.substr(i + 2, 2), nullptr, 16));
            i += 4;
            continue;
        }
        value += c;
        i++;
    }
    return false;
}

void check(const char *name, Switch (*read)(const char *), bool dflt,
           const std::string &value) {
    Switch unset = read(nullptr);
    FUZZ_CHECK(unset.on == dflt && unset.note.empty(), "%s unset", name);

    Switch s = read(value.c_str());
    if (value.empty() || value == "0" || value == "1") {
        bool want = value.empty() ? dflt : value == "1";
        FUZZ_CHECK(s.on == want && s.note.empty(), "%s=\"%s\": on %d, note %s",
                   name, value.c_str(), s.on, s.note.c_str());
        return;
    }
    FUZZ_CHECK(s.on == dflt, "%s=%s: on %d, want the default %d", name,
               s.note.c_str(), s.on, dflt);
    std::string prefix = std::string(name) + "=";
    FUZZ_CHECK(s.note.compare(0, prefix.size(), prefix) == 0,
               "note %s does not start with %s", s.note.c_str(),
               prefix.c_str());
    for (char c : s.note)
        FUZZ_CHECK(c >= 0x20 && c <= 0x7e, "note has byte %#x",
                   static_cast<unsigned char>(c));
    FUZZ_CHECK(s.note.size() <= prefix.size() + 4 * kQuotedMax + 64,
               "note of %zu bytes", s.note.size());
    std::string quoted;
    FUZZ_CHECK(unquote(s.note, prefix.size(), quoted),
               "note %s quotes no value", s.note.c_str());
    // A longer value is quoted as its first bytes and "...".
    std::string want = value.size() > kQuotedMax
                           ? value.substr(0, kQuotedMax) + "..."
                           : value;
    FUZZ_CHECK(quoted == want, "note %s does not quote the value %zu bytes",
               s.note.c_str(), value.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // An environment value ends at its first NUL.
    std::string value(reinterpret_cast<const char *>(data),
                      strnlen(reinterpret_cast<const char *>(data), size));
    check("MC_PXN_ENABLE", mooncake::pxn::enableSwitch, false, value);
    check("MC_PXN_SUBMIT_PIECE", mooncake::pxn::submitPieceSwitch, true, value);
    return 0;
}
