// SPDX-License-Identifier: Apache-2.0

// A peer's segment descriptor, as Mooncake's metadata hands it to the
// transport: buffers (location, range, one remote key per NIC), the
// topology's NICs per location and the NIC list, built from the input with
// names from a small pool so that lookups meet. The transport's lookup of a
// destination agrees with a model written here in 128-bit arithmetic; what
// it accepts lies inside the buffer it names, with a NIC and key index
// within their lists; libpxn's resolve answer holds a NUL-terminated NIC
// name or is refused untouched.

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "pxn_parse.h"

namespace pxn = mooncake::pxn;
using u128 = unsigned __int128;

namespace {

// The fields of Mooncake's BufferDesc and TopologyEntry the transport reads.
struct Buffer {
    std::string name;
    uint64_t addr = 0;
    uint64_t length = 0;
    std::vector<uint32_t> rkey;
    std::string protocol;
};

struct Entry {
    std::vector<std::string> preferred_hca;
    std::vector<std::string> avail_hca;
};

const char *const kWildcard = "*";

std::string pick(FuzzedDataProvider &in, const std::vector<std::string> &pool) {
    size_t i = in.ConsumeIntegralInRange<size_t>(0, pool.size());
    if (i < pool.size()) return pool[i];
    return in.ConsumeRandomLengthString(96);
}

std::vector<std::string> pickList(FuzzedDataProvider &in,
                                  const std::vector<std::string> &pool,
                                  size_t most) {
    std::vector<std::string> out(in.ConsumeIntegralInRange<size_t>(0, most));
    for (auto &s : out) s = pick(in, pool);
    return out;
}

// An address near one the descriptor already holds, or anywhere.
uint64_t address(FuzzedDataProvider &in, const std::vector<Buffer> &bufs) {
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
        case 0:
            return in.ConsumeIntegral<uint64_t>();
        case 1:
            return UINT64_MAX - in.ConsumeIntegralInRange<uint64_t>(0, 4096);
        default:
            if (bufs.empty()) return in.ConsumeIntegral<uint64_t>();
            const Buffer &b = bufs[in.ConsumeIntegralInRange<size_t>(
                0, bufs.size() - 1)];
            return b.addr + in.ConsumeIntegralInRange<uint64_t>(0, 4096) -
                   in.ConsumeIntegralInRange<uint64_t>(0, 64);
    }
}

struct Want {
    bool found = false;
    pxn::Target t;
};

// The lookup as pxn_parse.h states it, in arithmetic that cannot wrap.
Want model(const std::vector<Buffer> &bufs,
           const std::map<std::string, Entry> &matrix,
           const std::vector<std::string> &hcas, uint64_t dst, uint64_t len) {
    Want w;
    for (const Buffer &b : bufs) {
        if (!b.protocol.empty() && b.protocol != "rdma") continue;
        if (b.rkey.empty()) continue;
        u128 end = u128(b.addr) + b.length;
        if (dst < b.addr || u128(dst) >= end || u128(dst) + len > end) continue;
        auto it = matrix.find(b.name);
        if (it == matrix.end()) it = matrix.find(kWildcard);
        if (it == matrix.end()) return w;
        const auto &serving = it->second.preferred_hca.empty()
                                  ? it->second.avail_hca
                                  : it->second.preferred_hca;
        if (serving.empty()) return w;
        size_t idx = 0;
        while (idx < hcas.size() && hcas[idx] != serving[0]) idx++;
        if (idx == hcas.size() || idx >= b.rkey.size()) return w;
        w.found = true;
        w.t.hca_count = static_cast<uint32_t>(serving.size());
        w.t.hca = serving[0];
        w.t.base = b.addr;
        w.t.length = b.length;
        w.t.rkey = b.rkey[idx];
        w.t.device = idx;
        return w;
    }
    return w;
}

void checkResolveAnswer(const pxn::Target &t, uint64_t route) {
    pxn_target_info info;
    std::memset(&info, 0xa5, sizeof info);
    pxn_target_info before = info;
    int rc = pxn::targetInfo(t, route, info);
    if (t.hca.size() >= PXN_HCA_NAME_MAX) {
        FUZZ_CHECK(rc == PXN_EINVAL, "NIC name of %zu bytes: rc %d",
                   t.hca.size(), rc);
        FUZZ_CHECK(std::memcmp(&info, &before, sizeof info) == 0,
                   "a refused answer was written");
        return;
    }
    FUZZ_CHECK(rc == PXN_OK, "NIC name of %zu bytes: rc %d", t.hca.size(), rc);
    FUZZ_CHECK(info.hca[t.hca.size()] == '\0' &&
                   std::memcmp(info.hca, t.hca.data(), t.hca.size()) == 0,
               "hca field does not hold the %zu-byte name", t.hca.size());
    FUZZ_CHECK(info.hca_count == t.hca_count && info.range_base == t.base &&
                   info.range_len == t.length && info.route == route &&
                   info.remote_key == t.rkey,
               "answer fields differ from the target");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzedDataProvider in(data, size);
    // The long names sit on either side of what pxn_target_info.hca holds.
    const std::vector<std::string> nics = {
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "",
        std::string(PXN_HCA_NAME_MAX - 1, 'n'), std::string(PXN_HCA_NAME_MAX, 'n')};
    const std::vector<std::string> locations = {"cpu:0", "cuda:0", "cuda:1",
                                                kWildcard, ""};

    std::vector<std::string> hcas = pickList(in, nics, 6);
    std::map<std::string, Entry> matrix;
    for (size_t n = in.ConsumeIntegralInRange<size_t>(0, 4); n > 0; n--) {
        Entry &e = matrix[pick(in, locations)];
        e.preferred_hca = pickList(in, nics, 3);
        e.avail_hca = pickList(in, nics, 3);
    }
    std::vector<Buffer> bufs(in.ConsumeIntegralInRange<size_t>(0, 6));
    for (Buffer &b : bufs) {
        b.name = pick(in, locations);
        b.addr = in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>()
                                  : in.ConsumeIntegralInRange<uint64_t>(0, 1 << 20);
        b.length = in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>()
                                    : in.ConsumeIntegralInRange<uint64_t>(0, 1 << 20);
        b.rkey.resize(in.ConsumeIntegralInRange<size_t>(0, 6));
        for (auto &k : b.rkey) k = in.ConsumeIntegral<uint32_t>();
        b.protocol = pick(in, {"", "rdma", "tcp"});
    }
    uint64_t dst = address(in, bufs);
    uint64_t len = in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>()
                                    : in.ConsumeIntegralInRange<uint64_t>(0, 8192);
    std::string session = in.ConsumeRandomLengthString(PXN_MAX_SESSION + 8);
    uint64_t route = in.ConsumeIntegral<uint64_t>();

    FUZZ_CHECK(pxn::sessionNameFits(session) ==
                   (!session.empty() && session.size() <= PXN_MAX_SESSION),
               "session name of %zu bytes", session.size());

    pxn::LocationHcas serving = pxn::locationHcas(matrix);
    FUZZ_CHECK(serving.size() == matrix.size(), "%zu locations of %zu",
               serving.size(), matrix.size());
    pxn::Target got;
    bool found = pxn::findTarget(bufs, serving, hcas, kWildcard, dst, len, got);
    Want want = model(bufs, matrix, hcas, dst, len);
    FUZZ_CHECK(found == want.found, "[%#llx,+%llu): found %d, model %d",
               (unsigned long long)dst, (unsigned long long)len, found,
               want.found);
    if (!found) return 0;
    FUZZ_CHECK(got.base == want.t.base && got.length == want.t.length &&
                   got.hca == want.t.hca && got.hca_count == want.t.hca_count &&
                   got.rkey == want.t.rkey && got.device == want.t.device,
               "target differs from the model's");
    FUZZ_CHECK(dst >= got.base && u128(dst) + len <= u128(got.base) + got.length,
               "[%#llx,+%llu) outside the buffer", (unsigned long long)dst,
               (unsigned long long)len);
    FUZZ_CHECK(got.device < hcas.size() && hcas[got.device] == got.hca,
               "device %zu of %zu NICs", got.device, hcas.size());
    FUZZ_CHECK(got.hca_count >= 1, "no serving NIC");
    checkResolveAnswer(got, route);
    return 0;
}
