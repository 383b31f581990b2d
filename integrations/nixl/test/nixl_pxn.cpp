// SPDX-License-Identifier: Apache-2.0
// A NIXL program for PXN's NIXL check (integrations/nixl/test/run.sh): NIXL
// agents with NIXL's Mooncake backend, DRAM buffers, processes that meet
// through files in DIR (metadata, addresses, "ready" marks).
//
//   nixl_pxn target DIR N      registers a zeroed buffer, waits for ROUNDS
//                              notifications from each of N initiators, then
//                              checks every byte of it: each written range
//                              holds its pattern, every gap is still zero
//   nixl_pxn relay DIR         creates the backend (a PXN rank on its rail)
//                              and stays until DIR/all-done
//   nixl_pxn initiator DIR I   writes ROUNDS write lists (several descriptors
//                              of odd sizes, one request each, with a
//                              notification) into initiator I's part of the
//                              target's buffer
//
// T_WAIT_S: seconds an initiator waits before its first write (default 2);
// T_HOLD_S: seconds the relay and initiators stay after the last write, so
// pxn-agent inspect reads their counters (default 0).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "nixl.h"

namespace {

constexpr int kRounds = 2;
// One write list: descriptor sizes, odd on purpose (one byte, not a page
// multiple, larger than Mooncake's slices).
const std::vector<size_t> kSizes = {65536, 4096, 100000, 1, 131072, 8191, 40960};
constexpr size_t kGap = 64;  // untouched bytes after each destination range

struct Piece {
  size_t src_off, dst_off, len;
};

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// The bytes one round of one initiator covers in the target's buffer.
size_t round_span() {
  size_t s = 0;
  for (size_t n : kSizes) s += align_up(n + kGap, 4096);
  return s;
}
size_t list_bytes() {
  size_t s = 0;
  for (size_t n : kSizes) s += n;
  return s;
}

// layout(I, R): where round R of initiator I reads (its source buffer, the
// descriptors in reverse order) and writes (the target's buffer, in order,
// each range followed by a gap).
std::vector<Piece> layout(int init, int round) {
  std::vector<Piece> v;
  size_t dst = (size_t(init) * kRounds + round) * round_span(), src = 0;
  for (size_t i = 0; i < kSizes.size(); i++) {
    v.push_back({0, dst, kSizes[i]});
    dst += align_up(kSizes[i] + kGap, 4096);
  }
  for (size_t i = kSizes.size(); i-- > 0;) {
    v[i].src_off = src;
    src += kSizes[i];
  }
  return v;
}

uint8_t pattern(int init, int round, size_t piece, size_t i) {
  return uint8_t(1 + ((init * 73 + round * 37 + piece * 151 + i * 7 + (i >> 8) * 13) % 255));
}

std::string slurp_wait(const std::string &p, int secs) {
  for (int i = 0; i < secs * 10; i++) {
    std::ifstream ready(p + ".ready");
    if (ready) {
      std::ifstream in(p, std::ios::binary);
      std::stringstream s;
      s << in.rdbuf();
      return s.str();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cerr << "timeout waiting for " << p << "\n";
  exit(3);
}

void put(const std::string &p, const std::string &d) {
  { std::ofstream(p, std::ios::binary) << d; }
  std::ofstream(p + ".ready") << "1";
}

int env_int(const char *name, int def) {
  const char *v = getenv(name);
  return v ? atoi(v) : def;
}

}  // namespace

#define CHECK(x, m)                                                                     \
  do {                                                                                  \
    nixl_status_t s_ = (x);                                                             \
    if (s_ != NIXL_SUCCESS) {                                                           \
      std::cerr << me << ": " << m << " failed: " << nixlEnumStrings::statusStr(s_) << "\n"; \
      return 2;                                                                         \
    }                                                                                   \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 3) {
    std::cerr << "usage: nixl_pxn target DIR N | relay DIR | initiator DIR I\n";
    return 1;
  }
  std::string role = argv[1], dir = argv[2];
  int arg = argc > 3 ? atoi(argv[3]) : 0;
  std::string me = role == "initiator" ? "initiator" + std::to_string(arg) : role;

  nixlAgentConfig cfg(true);
  nixlAgent agent(me, cfg);
  nixl_b_params_t params;
  nixl_mem_list_t mems;
  CHECK(agent.getPluginParams("Mooncake", mems, params), "getPluginParams(Mooncake)");
  nixlBackendH *backend = nullptr;
  CHECK(agent.createBackend("Mooncake", params, backend), "createBackend(Mooncake)");
  std::cout << me << ": Mooncake backend created" << std::endl;

  if (role == "relay") {
    slurp_wait(dir + "/all-done", 300);
    std::this_thread::sleep_for(std::chrono::seconds(env_int("T_HOLD_S", 0)));
    return 0;
  }

  nixl_opt_args_t extra;
  extra.backends.push_back(backend);

  if (role == "target") {
    int n = arg;
    if (n < 1) {
      std::cerr << "target: want the number of initiators\n";
      return 1;
    }
    size_t len = size_t(n) * kRounds * round_span();
    auto *buf = static_cast<uint8_t *>(aligned_alloc(4096, len));
    memset(buf, 0, len);
    nixl_reg_dlist_t reg(DRAM_SEG);
    nixlBlobDesc d;
    d.addr = uintptr_t(buf);
    d.len = len;
    d.devId = 0;
    reg.addDesc(d);
    CHECK(agent.registerMem(reg, &extra), "registerMem");
    std::string md;
    CHECK(agent.getLocalMD(md), "getLocalMD");
    put(dir + "/target.md", md);
    put(dir + "/target.addr", std::to_string(uintptr_t(buf)));
    for (int i = 0; i < n; i++) {
      std::string name;
      CHECK(agent.loadRemoteMD(slurp_wait(dir + "/initiator" + std::to_string(i) + ".md", 120), name),
            "loadRemoteMD");
    }
    // ROUNDS notifications from each initiator, each naming its round.
    std::vector<int> got(n, 0);
    int want = n * kRounds, seen = 0;
    auto t0 = std::chrono::steady_clock::now();
    while (seen < want) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) {
        std::cerr << "target: " << seen << " of " << want << " notifications in 120 s\n";
        return 4;
      }
      nixl_notifs_t notifs;
      CHECK(agent.getNotifs(notifs), "getNotifs");
      for (auto &kv : notifs)
        for (auto &m : kv.second) {
          std::cout << "target: notification from " << kv.first << ": " << m << std::endl;
          int i = -1, r = -1;
          if (sscanf(m.c_str(), "pxn-nixl initiator%d round%d", &i, &r) != 2 || i < 0 || i >= n) {
            std::cerr << "target: unexpected notification " << m << "\n";
            return 4;
          }
          got[i]++;
          seen++;
        }
      if (notifs.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // Every byte: written ranges hold their pattern, the rest is zero.
    std::vector<uint8_t> want_buf(len, 0);
    size_t written = 0;
    for (int i = 0; i < n; i++)
      for (int r = 0; r < kRounds; r++) {
        auto pieces = layout(i, r);
        for (size_t p = 0; p < pieces.size(); p++) {
          for (size_t k = 0; k < pieces[p].len; k++) want_buf[pieces[p].dst_off + k] = pattern(i, r, p, k);
          written += pieces[p].len;
        }
      }
    size_t bad = 0, first = 0;
    for (size_t k = 0; k < len; k++)
      if (buf[k] != want_buf[k] && bad++ == 0) first = k;
    std::cout << "target: checked " << len << " bytes (" << written << " written by " << n << " initiators in "
              << n * kRounds << " write lists of " << kSizes.size() << " descriptors, " << len - written
              << " untouched): " << (bad ? "MISMATCH" : "OK") << std::endl;
    if (bad) {
      std::cerr << "target: " << bad << " bytes differ, the first at offset " << first << " (got "
                << int(buf[first]) << ", want " << int(want_buf[first]) << ")\n";
    }
    put(dir + "/target.checked", bad ? "MISMATCH" : "OK");
    agent.deregisterMem(reg, &extra);
    return bad ? 5 : 0;
  }

  if (role != "initiator") {
    std::cerr << "unknown role " << role << "\n";
    return 1;
  }
  size_t len = list_bytes();
  std::vector<uint8_t *> bufs;
  nixl_reg_dlist_t reg(DRAM_SEG);
  for (int r = 0; r < kRounds; r++) {
    auto *b = static_cast<uint8_t *>(aligned_alloc(4096, align_up(len, 4096)));
    auto pieces = layout(arg, r);
    for (size_t p = 0; p < pieces.size(); p++)
      for (size_t k = 0; k < pieces[p].len; k++) b[pieces[p].src_off + k] = pattern(arg, r, p, k);
    nixlBlobDesc d;
    d.addr = uintptr_t(b);
    d.len = len;
    d.devId = 0;
    reg.addDesc(d);
    bufs.push_back(b);
  }
  CHECK(agent.registerMem(reg, &extra), "registerMem");
  std::string md;
  CHECK(agent.getLocalMD(md), "getLocalMD");
  put(dir + "/" + me + ".md", md);
  std::string target;
  CHECK(agent.loadRemoteMD(slurp_wait(dir + "/target.md", 120), target), "loadRemoteMD");
  uintptr_t raddr = std::stoull(slurp_wait(dir + "/target.addr", 120));
  std::this_thread::sleep_for(std::chrono::seconds(env_int("T_WAIT_S", 2)));

  for (int r = 0; r < kRounds; r++) {
    nixl_xfer_dlist_t src(DRAM_SEG), dst(DRAM_SEG);
    for (auto &p : layout(arg, r)) {
      nixlBasicDesc s, t;
      s.addr = uintptr_t(bufs[r]) + p.src_off;
      s.len = p.len;
      s.devId = 0;
      t.addr = raddr + p.dst_off;
      t.len = p.len;
      t.devId = 0;
      src.addDesc(s);
      dst.addDesc(t);
    }
    nixl_opt_args_t x = extra;
    x.notif = "pxn-nixl " + me + " round" + std::to_string(r);
    x.hasNotif = true;
    nixlXferReqH *req = nullptr;
    CHECK(agent.createXferReq(NIXL_WRITE, src, dst, target, req, &x), "createXferReq");
    nixl_status_t st = agent.postXferReq(req);
    auto t0 = std::chrono::steady_clock::now();
    while (st == NIXL_IN_PROG && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      st = agent.getXferStatus(req);
    std::cout << me << ": round " << r << ": " << kSizes.size() << " descriptors, " << len << " bytes: "
              << nixlEnumStrings::statusStr(st) << std::endl;
    if (st != NIXL_SUCCESS) return 6;
    agent.releaseXferReq(req);
  }
  put(dir + "/" + me + ".done", "1");
  slurp_wait(dir + "/all-done", 300);
  std::this_thread::sleep_for(std::chrono::seconds(env_int("T_HOLD_S", 0)));
  agent.deregisterMem(reg, &extra);
  agent.invalidateRemoteMD(target);
  std::cout << me << ": done" << std::endl;
  return 0;
}
