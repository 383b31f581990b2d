// SPDX-License-Identifier: Apache-2.0

// Checks, in a Mooncake build with the PXN patch, that PxnRdmaTransport sees
// the engine's struct layouts, and that a view compiled under other
// definitions is reported as different. Prints the engine's view
// ("LAYOUT name value"), then one PASS or FAIL line per case and DONE;
// exits 1 when a case failed.
#include <cstdio>
#include <string>

#include "pxn_layout.h"
#include "pxn_rdma_transport.h"

extern "C" size_t pxn_mooncake_skewed_layout(const pxn_layout_field **out);

namespace {

int failed = 0;

void report(bool ok, const char *name, const std::string &why) {
    std::printf("%s %s: %s\n", ok ? "PASS" : "FAIL", name, why.c_str());
    if (!ok) failed++;
}

}  // namespace

int main() {
    const pxn_layout_field *engine, *transport, *skewed;
    size_t ne = pxn_mooncake_engine_layout(&engine);
    size_t nt = pxn_mooncake_transport_layout(&transport);
    size_t ns = pxn_mooncake_skewed_layout(&skewed);
    for (size_t i = 0; i < ne; i++)
        std::printf("LAYOUT %s %llu\n", engine[i].name,
                    static_cast<unsigned long long>(engine[i].value));

    std::string m = mooncake::pxnLayoutMismatch(engine, ne, transport, nt);
    report(m.empty(), "transport_matches_engine",
           m.empty() ? std::to_string(ne) + " sizes and offsets agree" : m);

    m = mooncake::PxnRdmaTransport::layoutMismatch();
    report(m.empty(), "install_check_agrees",
           m.empty() ? "PxnRdmaTransport::layoutMismatch is empty" : m);

    // WITH_METRICS adds TransferTask::start_time before request: the size
    // and every later offset move, and the first one listed must be named.
    m = mooncake::pxnLayoutMismatch(engine, ne, skewed, ns);
    const std::string want = "sizeof(mooncake::Transport::TransferTask)";
    report(m.rfind(want + ": ", 0) == 0, "skew_is_caught",
           m.empty() ? "a view compiled with WITH_METRICS flipped matched the "
                       "engine's"
                     : m);

    std::printf("DONE\n");
    return failed ? 1 : 0;
}
