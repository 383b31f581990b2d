// SPDX-License-Identifier: Apache-2.0

#include "pxn_engine.h"

#include <glog/logging.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "memory_location.h"
#include "pxn_parse.h"

namespace mooncake {

namespace {

bool isDeviceLocation(const std::string &location) {
    return location.rfind("cuda:", 0) == 0;
}

}  // namespace

PxnRdmaTransport::Engine::Engine(PxnRdmaTransport &o)
    : owner(o),
      segments(o),
      tasks(lib, &Engine::allocateSlice),
      ops(o, segments),
      pieces(o, segments, local_hca_index) {}

pxn::Slice *PxnRdmaTransport::Engine::allocateSlice() {
    return Transport::getSliceCache().allocate();
}

std::unique_ptr<PxnRdmaTransport::Engine> PxnRdmaTransport::Engine::open(
    PxnRdmaTransport &owner, const std::shared_ptr<Topology> &topo,
    std::string &why) {
    auto e = std::make_unique<Engine>(owner);
    if (!e->lib.load(why)) return nullptr;
    const auto &hcas = topo->getHcaList();
    if (hcas.size() != 1) {
        why = "this process uses " + std::to_string(hcas.size()) +
              " NICs; PXN needs exactly one (restrict the topology to the "
              "NIC nearest the GPU)";
        return nullptr;
    }
    e->local_hca = hcas[0];
    e->table.struct_size = sizeof(pxn_transport);
    e->table.user = e.get();
    e->table.submit = &Engine::submitCb;
    e->table.poll = &Engine::pollCb;
    pxn::Switch piece =
        pxn::submitPieceSwitch(std::getenv("MC_PXN_SUBMIT_PIECE"));
    if (!piece.note.empty()) LOG(WARNING) << piece.note;
    if (piece.on) e->table.submit_piece = &Engine::submitPieceCb;

    pxn_options o{};
    o.struct_size = sizeof o;
    o.version = PXN_OPTIONS_VERSION;
    o.local_hca = e->local_hca.c_str();
    o.transport = &e->table;
    o.resolve = &Engine::resolveCb;
    o.resolve_user = e.get();
    o.copier = PXN_COPIER_DEFAULT;
    o.register_arena = &Engine::registerArenaCb;
    o.deregister_arena = &Engine::deregisterArenaCb;
    o.arena_user = e.get();
    if (e->lib.open(&o, &e->lib.handle) != PXN_OK) {
        why = "pxn_open: " + e->lib.lastError();
        return nullptr;
    }
    if (e->lib.is_active(e->lib.handle) != 1) {
        why = "libpxn is inactive on NIC " + e->local_hca + " (it logged why)";
        e->lib.close(e->lib.handle, 0);
        return nullptr;
    }
    // An active engine hands its arena over during pxn_open; a relay whose
    // arena RDMA never registered would post from memory no NIC may read.
    if (!e->arena_offered) {
        why = PXN_LIBRARY " did not offer its staging arena for registration";
        e->lib.close(e->lib.handle, 0);
        return nullptr;
    }
    pxn_counters c{};
    c.struct_size = sizeof c;
    e->lib.get_counters(e->lib.handle, &c);
    LOG(INFO) << "PXN on: NIC " << e->local_hca << ", copier "
              << (c.copier == PXN_COPIER_CUDA ? "cuda" : "host");
    return e;
}

void PxnRdmaTransport::Engine::close() {
    bool first = !closed.exchange(true);
    if (first) {
        int rc = lib.close(lib.handle, 5000);
        if (rc != PXN_OK) LOG(WARNING) << "pxn_close: " << lib.lastError();
        tasks.failAll();
    }
    size_t held = pieces.sweep();
    held += ops.sweep();
    if (held && first)
        LOG(WARNING) << "PXN closed with " << held
                     << " op batches still held by RDMA";
}

void PxnRdmaTransport::Engine::noteMemory(void *addr, size_t length,
                                          const std::string &location) {
    std::string loc = location;
    if (loc == kWildcardLocation) {
        pxn::BufferDesc b;
        loc = segments.localBuffer(addr, b) ? b.name : "";
    }
    if (!isDeviceLocation(loc) || length == 0) return;
    auto start = reinterpret_cast<uintptr_t>(addr);
    device_memory.add(start, length);
    if (lib.register_memory(lib.handle, addr, length, PXN_MEM_DEVICE) !=
        PXN_OK) {
        LOG(WARNING) << "PXN: writes from " << addr << " (" << length
                     << " bytes, " << loc
                     << ") go direct: " << lib.lastError();
        device_memory.remove(start);
    }
}

void PxnRdmaTransport::Engine::forgetMemory(void *addr) {
    device_memory.remove(reinterpret_cast<uintptr_t>(addr));
}

bool PxnRdmaTransport::Engine::eligible(
    const pxn::TransferTask &t, pxn_request &r,
    std::shared_ptr<pxn::SegmentDesc> &desc) {
    if (t.request == nullptr || t.request_count != 1) return false;
    const auto &q = t.request[0];
    if (q.opcode != TransferRequest::WRITE || q.length == 0 ||
        q.target_id == LOCAL_SEGMENT_ID)
        return false;
    if (!device_memory.holds(q.source, q.length)) return false;
    desc = segments.desc(q.target_id);
    if (!desc || !pxn::sessionNameFits(desc->name)) return false;
    pxn::Target tg;
    if (!segments.target(q.target_id, desc, q.target_offset, q.length, tg))
        return false;
    // A NIC of this process's own name is this process's rail; libpxn
    // decides the rest by the rail map.
    if (tg.hca_count != 1 || tg.hca == local_hca) return false;
    r = pxn_request{};
    r.op = PXN_OP_WRITE;
    r.src = q.source;
    r.len = q.length;
    r.target = desc->name.c_str();
    r.dst = q.target_offset;
    r.stream = nullptr;
    return true;
}

void PxnRdmaTransport::Engine::route(
    const std::vector<pxn::TransferTask *> &in,
    std::vector<pxn::TransferTask *> &direct) {
    std::vector<pxn::TransferTask *> mine;
    std::vector<pxn_request> reqs;
    std::vector<std::shared_ptr<pxn::SegmentDesc>> keep;
    for (auto *t : in) {
        pxn_request r;
        std::shared_ptr<pxn::SegmentDesc> desc;
        if (eligible(*t, r, desc)) {
            mine.push_back(t);
            reqs.push_back(r);
            keep.push_back(std::move(desc));
        } else {
            direct.push_back(t);
        }
    }
    if (mine.empty()) return;
    pxn_batch_t b = 0;
    if (lib.submit(lib.handle, reqs.data(), reqs.size(), &b) != PXN_OK) {
        LOG_EVERY_N(WARNING, 1000)
            << "PXN: pxn_submit refused " << reqs.size()
            << " writes, sent direct: " << lib.lastError();
        direct.insert(direct.end(), mine.begin(), mine.end());
        return;
    }
    tasks.adopt(mine, b);
}

int PxnRdmaTransport::Engine::resolveCb(void *user, const char *session,
                                        uint64_t dst, pxn_target_info *out) {
    auto *e = static_cast<Engine *>(user);
    SegmentID id;
    std::shared_ptr<pxn::SegmentDesc> desc;
    if (!e->segments.byName(session, id, desc)) return PXN_EINVAL;
    pxn::Target t;
    if (!e->segments.target(id, desc, dst, 1, t)) return PXN_EINVAL;
    return pxn::targetInfo(t, id, *out);
}

int PxnRdmaTransport::Engine::registerArenaCb(void *user, void *addr,
                                              uint64_t len, int kind,
                                              uint64_t *local_key) {
    auto *e = static_cast<Engine *>(user);
    e->arena_offered = true;
    // Local only: no remote key, and no metadata update of its own.
    int rc = e->owner.RdmaTransport::registerLocalMemory(
        addr, len, kWildcardLocation, false, false);
    if (rc != 0) {
        LOG(WARNING) << "PXN: registering the "
                     << (kind == PXN_MEM_DEVICE ? "device" : "host")
                     << " staging arena " << addr << " (" << len
                     << " bytes) with RDMA failed (" << rc
                     << "); this rank does not relay";
        return PXN_EIO;
    }
    pxn::BufferDesc b;
    if (e->segments.localBuffer(addr, b) && e->local_hca_index < b.lkey.size()) {
        *local_key = b.lkey[e->local_hca_index];
        e->pieces.addArena(reinterpret_cast<uintptr_t>(addr), len, *local_key);
        return PXN_OK;
    }
    LOG(WARNING) << "PXN: the staging arena " << addr
                 << " has no local key on NIC " << e->local_hca
                 << " after registration; this rank does not relay";
    e->owner.RdmaTransport::unregisterLocalMemory(addr, false);
    return PXN_EIO;
}

int PxnRdmaTransport::Engine::deregisterArenaCb(void *user, void *addr,
                                                uint64_t, uint64_t) {
    auto *e = static_cast<Engine *>(user);
    e->pieces.dropArena(reinterpret_cast<uintptr_t>(addr));
    if (e->owner.RdmaTransport::unregisterLocalMemory(addr, false) != 0)
        return PXN_EIO;
    return PXN_OK;
}

int PxnRdmaTransport::Engine::submitCb(void *user,
                                       const pxn_transport_op *ops,
                                       size_t count) {
    return static_cast<Engine *>(user)->ops.submit(ops, count);
}

size_t PxnRdmaTransport::Engine::pollCb(void *user,
                                        pxn_transport_completion *out,
                                        size_t capacity) {
    auto *e = static_cast<Engine *>(user);
    size_t n = e->ops.poll(out, capacity);
    return n + e->pieces.poll(out + n, capacity - n);
}

int PxnRdmaTransport::Engine::submitPieceCb(void *user,
                                            const pxn_transport_op *ops,
                                            size_t count, uint64_t token) {
    return static_cast<Engine *>(user)->pieces.submit(ops, count, token);
}

}  // namespace mooncake
