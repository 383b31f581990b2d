// SPDX-License-Identifier: Apache-2.0

#include "pxn_rdma_transport.h"

#include <dlfcn.h>
#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "common.h"
#include "config.h"
#include "memory_location.h"
#include "pxn.h"
#include "pxn_layout.h"

#ifndef PXN_LIBRARY
#define PXN_LIBRARY "libpxn.so"
#endif

// The transport's view of the structs it shares with the engine.
PXN_MOONCAKE_DEFINE_LAYOUT(pxn_mooncake_transport_layout)

namespace mooncake {

namespace {

bool pxnRequested() {
    const char *v = std::getenv("MC_PXN_ENABLE");
    return v != nullptr && std::strcmp(v, "1") == 0;
}

bool isDeviceLocation(const std::string &location) {
    return location.rfind("cuda:", 0) == 0;
}

// Identifies the one slice of a task that was handed to libpxn. The slice
// stands for the whole request: MultiTransport's slice timeout reads its
// timestamp, and ~TransferTask returns it to the slice cache.
void pxnTaskSlice(Transport::Slice *) {}

// Written into such a slice's rdma.retry_cnt, which nothing else reads on
// it, when libpxn reported the task TIMEOUT.
constexpr uint32_t kTimedOutMark = 0x7fffffff;

bool isFinal(int32_t state) {
    return state != PXN_TASK_WAITING && state != PXN_TASK_PENDING;
}

// MC_PXN_SUBMIT_PIECE=0: relayed Pieces go through submit, op by op.
bool pieceSubmitWanted() {
    const char *v = std::getenv("MC_PXN_SUBMIT_PIECE");
    return v == nullptr || std::strcmp(v, "0") != 0;
}

// The longest slice the Piece path posts; Mooncake's slice_size when
// smaller.
constexpr uint64_t kPieceSliceMax = 64 << 10;

// How long a cached route is used before it is looked up again, as
// Mooncake's own CONFIG_CACHE_SEGMENT_DESC keeps descriptors.
constexpr int64_t kRouteMaxAgeNs = 1000000000;

// Bounds on the route cache: past them it starts over.
constexpr size_t kMaxRouteSegments = 1024;
constexpr size_t kMaxRoutesPerSegment = 4096;

// libpxn, loaded only when MC_PXN_ENABLE=1: a Go shared library starts its
// runtime's threads when it is loaded. It is never unloaded.
struct PxnApi {
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

    template <typename F>
    bool sym(void *lib, const char *name, F &out, std::string &why) {
        out = reinterpret_cast<F>(dlsym(lib, name));
        if (out == nullptr) why = std::string(PXN_LIBRARY ": no symbol ") + name;
        return out != nullptr;
    }

    bool load(std::string &why) {
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

    std::string lastError() const {
        char buf[PXN_ERROR_MAX];
        last_error(buf, sizeof buf);
        return buf;
    }
};

}  // namespace

struct PxnRdmaTransport::Engine {
    using TransferStatusEnum = Transport::TransferStatusEnum;

    // One pxn_submit: its libpxn batch is freed once every task of it has
    // been reported final.
    struct Submission {
        pxn_batch_t batch;
        std::atomic<size_t> open;
    };

    struct TaskRef {
        Submission *sub;
        pxn_batch_t batch;
        size_t index;
    };

    // Ops libpxn handed over in one submit call, posted through
    // RdmaTransport as the tasks of one internal batch. requests is reserved
    // once: the tasks point into it.
    struct OpBatch {
        BatchID id = 0;
        std::vector<TransferRequest> requests;
        std::vector<uint64_t> tokens;
        // 0 open, 1 reported and finished, 2 reported as timed out while
        // RdmaTransport still holds its slices.
        std::vector<uint8_t> state;
        size_t open = 0;
    };

    // A destination as this process sees it: the buffer that holds it, the
    // NICs that serve the buffer's location, and the remote key for the
    // first of them.
    struct Target {
        uint32_t hca_count = 0;
        std::string hca;
        uint64_t base = 0;
        uint64_t length = 0;
        uint64_t rkey = 0;
        // hca's index in the segment's HCA list: its device and key index.
        size_t device = 0;
    };

    // A target buffer as the Piece path resolved it: what a slice into it
    // carries, and when it was resolved.
    struct Route {
        uint64_t base = 0;
        uint64_t length = 0;
        uint64_t rkey = 0;
        std::string peer_nic_path;
        int64_t resolved = 0;
    };

    // One relayed Piece in flight: the one task of an internal batch made
    // once, its slices counted on it. Slots, their batches and their slices
    // are kept for later Pieces.
    struct PieceSlot {
        BatchID batch = 0;
        TransferTask *task = nullptr;
        // Owned; as many as the largest Piece this slot carried needed.
        std::vector<Slice *> slices;
        // The first n of slices, as posted.
        std::vector<Slice *> post;
        // Where each op of the Piece goes.
        struct Hop {
            SegmentID id;
            std::vector<Route> *list;
            size_t index;
        };
        std::vector<Hop> hops;
        // The routes used, as (segment, buffer base), dropped if a slice
        // fails.
        std::vector<std::pair<SegmentID, uint64_t>> used;
        uint64_t token = 0;
        // Reported timed out while RDMA still holds slices of it.
        bool reported = false;
    };

    struct SegmentView {
        std::shared_ptr<SegmentDesc> desc;
        std::unordered_map<std::string, std::vector<std::string>> hcas;
    };

    explicit Engine(PxnRdmaTransport &o) : owner(o) {}

    ~Engine() { freeSlots(); }

    PxnRdmaTransport &owner;
    PxnApi api;
    pxn_engine_t handle = 0;
    std::string local_hca;
    size_t local_hca_index = 0;
    pxn_transport table{};

    std::shared_mutex mem_mu;
    std::map<uintptr_t, uintptr_t> device;  // start -> end

    std::mutex seg_mu;
    std::unordered_map<SegmentID, SegmentView> views;
    std::unordered_map<std::string, SegmentID> names;

    std::mutex task_mu;
    std::unordered_map<const TransferTask *, TaskRef> tasks;
    std::atomic<uint64_t> live_submissions{0};

    std::mutex op_mu;
    std::vector<OpBatch *> live;
    std::vector<pxn_transport_completion> refused;

    bool arena_offered = false;
    // The staging arena as registered: its key on this process's one NIC.
    uintptr_t arena_base = 0;
    uint64_t arena_len = 0;
    uint64_t arena_lkey = 0;

    // The Piece path (submit_piece): a route cache per target segment, and
    // pooled slots.
    std::mutex piece_mu;
    std::unordered_map<SegmentID, std::vector<Route>> routes;
    std::vector<PieceSlot *> free_slots;
    std::vector<PieceSlot *> flying;
    size_t slots_made = 0;
    // Times a slot grew its slices or its per-op vectors.
    size_t slot_grows = 0;
    std::vector<pxn_transport_completion> piece_refused;
    std::atomic<uint64_t> pieces{0};
    std::atomic<uint64_t> route_misses{0};
    std::atomic<uint64_t> route_drops{0};
    // Set by close: libpxn is gone and every request goes to RdmaTransport.
    std::atomic<bool> closed{false};

    // Opens libpxn, or returns null and says why in why.
    static std::unique_ptr<Engine> open(PxnRdmaTransport &owner,
                                        const std::shared_ptr<Topology> &topo,
                                        std::string &why) {
        auto e = std::make_unique<Engine>(owner);
        if (!e->api.load(why)) return nullptr;
        const auto &hcas = topo->getHcaList();
        if (hcas.size() != 1) {
            why = "this process uses " + std::to_string(hcas.size()) +
                  " NICs; PXN needs exactly one (restrict the topology to "
                  "the NIC nearest the GPU)";
            return nullptr;
        }
        e->local_hca = hcas[0];
        e->local_hca_index = 0;
        e->table.struct_size = sizeof(pxn_transport);
        e->table.user = e.get();
        e->table.submit = &Engine::submitCb;
        e->table.poll = &Engine::pollCb;
        if (pieceSubmitWanted()) e->table.submit_piece = &Engine::submitPieceCb;

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
        if (e->api.open(&o, &e->handle) != PXN_OK) {
            why = "pxn_open: " + e->api.lastError();
            return nullptr;
        }
        if (e->api.is_active(e->handle) != 1) {
            why = "libpxn is inactive on NIC " + e->local_hca +
                  " (it logged why)";
            e->api.close(e->handle, 0);
            return nullptr;
        }
        // An active engine hands its arena over during pxn_open; a relay
        // whose arena RDMA never registered would post from memory no NIC
        // may read.
        if (!e->arena_offered) {
            why = PXN_LIBRARY " did not offer its staging arena for "
                              "registration";
            e->api.close(e->handle, 0);
            return nullptr;
        }
        pxn_counters c{};
        c.struct_size = sizeof c;
        e->api.get_counters(e->handle, &c);
        LOG(INFO) << "PXN on: NIC " << e->local_hca << ", copier "
                  << (c.copier == PXN_COPIER_CUDA ? "cuda" : "host");
        return e;
    }

    // Closes libpxn (a drain of up to 5 s; when the host's transport still
    // holds second-hop ops, libpxn keeps its arena registered and allocated
    // until the process exits), fails for Mooncake the tasks libpxn still
    // had, and frees the internal batches RDMA has finished. A later call
    // frees those RDMA finished since.
    void close() {
        bool first = !closed.exchange(true);
        if (first) {
            int rc = api.close(handle, 5000);
            if (rc != PXN_OK)
                LOG(WARNING) << "pxn_close: " << api.lastError();
            std::vector<std::pair<TransferTask *, Submission *>> left;
            {
                std::lock_guard<std::mutex> g(task_mu);
                for (auto &kv : tasks)
                    left.emplace_back(const_cast<TransferTask *>(kv.first),
                                      kv.second.sub);
                tasks.clear();
            }
            std::sort(left.begin(), left.end(),
                      [](const auto &a, const auto &b) { return a.second < b.second; });
            Submission *prev = nullptr;
            for (auto &[task, sub] : left) {
                // Their libpxn batches went with the engine.
                if (Slice *sl = pxnSlice(*task)) sl->markFailed();
                if (sub != prev) {
                    delete sub;
                    live_submissions--;
                    prev = sub;
                }
            }
        }
        size_t held;
        {
            std::lock_guard<std::mutex> g(piece_mu);
            reapPieces(nullptr, 0);
            held = flying.size();
        }
        std::lock_guard<std::mutex> g(op_mu);
        held += sweep();
        if (held && first)
            LOG(WARNING) << "PXN closed with " << held
                         << " op batches still held by RDMA";
    }

    // Frees the op batches whose tasks RDMA has all finished, reporting
    // nothing to libpxn; returns how many are left. op_mu held.
    size_t sweep() {
        for (size_t i = 0; i < live.size();) {
            OpBatch *ob = live[i];
            reap(ob, nullptr, 0);
            if (ob->open == 0 && finished(ob)) {
                owner.Transport::freeBatchID(ob->id);
                delete ob;
                live[i] = live.back();
                live.pop_back();
                continue;
            }
            i++;
        }
        return live.size();
    }

    // Memory classification.

    // localBuffer copies the local segment's buffer that starts at addr.
    bool localBuffer(void *addr, TransferMetadata::BufferDesc &out) {
        auto local = owner.metadata_->getSegmentDescByID(LOCAL_SEGMENT_ID);
        if (!local) return false;
        for (const auto &b : local->buffers) {
            if (b.addr != reinterpret_cast<uint64_t>(addr)) continue;
            out = b;
            return true;
        }
        return false;
    }

    std::string registeredLocation(void *addr) {
        TransferMetadata::BufferDesc b;
        return localBuffer(addr, b) ? b.name : "";
    }

    void noteMemory(void *addr, size_t length, const std::string &location) {
        std::string loc = location;
        if (loc == kWildcardLocation) loc = registeredLocation(addr);
        if (!isDeviceLocation(loc) || length == 0) return;
        auto start = reinterpret_cast<uintptr_t>(addr);
        {
            std::unique_lock<std::shared_mutex> g(mem_mu);
            device[start] = start + length;
        }
        if (api.register_memory(handle, addr, length, PXN_MEM_DEVICE) !=
            PXN_OK) {
            LOG(WARNING) << "PXN: writes from " << addr << " (" << length
                         << " bytes, " << loc
                         << ") go direct: " << api.lastError();
            std::unique_lock<std::shared_mutex> g(mem_mu);
            device.erase(start);
        }
    }

    void forgetMemory(void *addr) {
        std::unique_lock<std::shared_mutex> g(mem_mu);
        device.erase(reinterpret_cast<uintptr_t>(addr));
    }

    bool isDevice(const void *p, size_t len) {
        auto a = reinterpret_cast<uintptr_t>(p);
        std::shared_lock<std::shared_mutex> g(mem_mu);
        auto it = device.upper_bound(a);
        if (it == device.begin()) return false;
        --it;
        return a >= it->first && a < it->second && len <= it->second - a;
    }

    // Targets.

    SegmentView &viewOf(SegmentID id, const std::shared_ptr<SegmentDesc> &desc) {
        auto &v = views[id];
        if (v.desc != desc) {
            v.desc = desc;
            v.hcas.clear();
            for (const auto &kv : desc->topology.getMatrix()) {
                const auto &e = kv.second;
                v.hcas[kv.first] =
                    e.preferred_hca.empty() ? e.avail_hca : e.preferred_hca;
            }
            names[desc->name] = id;
        }
        return v;
    }

    bool target(SegmentID id, const std::shared_ptr<SegmentDesc> &desc,
                uint64_t dst, uint64_t len, Target &out) {
        std::lock_guard<std::mutex> g(seg_mu);
        auto &v = viewOf(id, desc);
        for (const auto &b : desc->buffers) {
#ifdef ENABLE_MULTI_PROTOCOL
            if (!b.protocol.empty() && b.protocol != "rdma") continue;
#endif
            if (b.rkey.empty() || dst < b.addr || dst - b.addr >= b.length ||
                len > b.length - (dst - b.addr))
                continue;
            auto it = v.hcas.find(b.name);
            if (it == v.hcas.end()) it = v.hcas.find(kWildcardLocation);
            if (it == v.hcas.end() || it->second.empty()) return false;
            out.hca_count = static_cast<uint32_t>(it->second.size());
            out.hca = it->second[0];
            out.base = b.addr;
            out.length = b.length;
            const auto &list = desc->topology.getHcaList();
            auto pos = std::find(list.begin(), list.end(), out.hca);
            size_t idx = static_cast<size_t>(pos - list.begin());
            if (pos == list.end() || idx >= b.rkey.size()) return false;
            out.rkey = b.rkey[idx];
            out.device = idx;
            return true;
        }
        return false;
    }

    bool segmentByName(const char *session, SegmentID &id,
                       std::shared_ptr<SegmentDesc> &desc) {
        {
            std::lock_guard<std::mutex> g(seg_mu);
            auto it = names.find(session);
            if (it != names.end()) id = it->second;
            else id = static_cast<SegmentID>(-1);
        }
        if (id != static_cast<SegmentID>(-1)) {
            desc = owner.metadata_->getSegmentDescByID(id);
            if (desc) return true;
        }
        // A session this process has not opened: Mooncake fetches its
        // descriptor once; later Pieces find it in the cache above.
        desc = owner.metadata_->getSegmentDescByName(session);
        if (!desc) return false;
        id = owner.metadata_->getSegmentID(session);
        return id != static_cast<SegmentID>(-1) && id != LOCAL_SEGMENT_ID;
    }

    // Callbacks from libpxn.

    static int resolveCb(void *user, const char *session, uint64_t dst,
                         pxn_target_info *out) {
        auto *e = static_cast<Engine *>(user);
        SegmentID id;
        std::shared_ptr<SegmentDesc> desc;
        if (!e->segmentByName(session, id, desc)) return PXN_EINVAL;
        Target t;
        if (!e->target(id, desc, dst, 1, t)) return PXN_EINVAL;
        if (t.hca.size() >= PXN_HCA_NAME_MAX) return PXN_EINVAL;
        out->hca_count = t.hca_count;
        std::memcpy(out->hca, t.hca.c_str(), t.hca.size() + 1);
        out->range_base = t.base;
        out->range_len = t.length;
        out->route = id;
        out->remote_key = t.rkey;
        return PXN_OK;
    }

    static int registerArenaCb(void *user, void *addr, uint64_t len, int kind,
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
        TransferMetadata::BufferDesc b;
        if (e->localBuffer(addr, b) && e->local_hca_index < b.lkey.size()) {
            *local_key = b.lkey[e->local_hca_index];
            std::lock_guard<std::mutex> g(e->piece_mu);
            e->arena_base = reinterpret_cast<uintptr_t>(addr);
            e->arena_len = len;
            e->arena_lkey = *local_key;
            return PXN_OK;
        }
        LOG(WARNING) << "PXN: the staging arena " << addr
                     << " has no local key on NIC " << e->local_hca
                     << " after registration; this rank does not relay";
        e->owner.RdmaTransport::unregisterLocalMemory(addr, false);
        return PXN_EIO;
    }

    static int deregisterArenaCb(void *user, void *addr, uint64_t,
                                 uint64_t) {
        auto *e = static_cast<Engine *>(user);
        if (e->owner.RdmaTransport::unregisterLocalMemory(addr, false) != 0)
            return PXN_EIO;
        return PXN_OK;
    }

    static int submitCb(void *user, const pxn_transport_op *ops, size_t count) {
        return static_cast<Engine *>(user)->submitOps(ops, count);
    }

    static size_t pollCb(void *user, pxn_transport_completion *out,
                         size_t capacity) {
        auto *e = static_cast<Engine *>(user);
        size_t n = e->pollOps(out, capacity);
        return n + e->pollPieces(out + n, capacity - n);
    }

    static int submitPieceCb(void *user, const pxn_transport_op *ops,
                             size_t count, uint64_t token) {
        return static_cast<Engine *>(user)->submitPiece(ops, count, token);
    }

    static pxn_transport_completion refusal(uint64_t token, int code,
                                            const std::string &msg) {
        pxn_transport_completion c{};
        c.token = token;
        c.status = code;
        std::strncpy(c.message, msg.c_str(), PXN_MESSAGE_MAX - 1);
        return c;
    }

    int submitOps(const pxn_transport_op *ops, size_t count) {
        auto *ob = new OpBatch;
        ob->requests.reserve(count);
        ob->tokens.reserve(count);
        std::vector<pxn_transport_completion> no;
        for (size_t i = 0; i < count; i++) {
            const auto &op = ops[i];
            SegmentID id = 0;
            if (op.flags & PXN_OP_ROUTED) {
                // The route handle is the SegmentID resolve gave; Mooncake
                // never reuses one. The op is honoured only while the
                // segment still holds dst with the same remote key.
                auto desc = owner.metadata_->getSegmentDescByID(op.route);
                Target t;
                if (!desc || !target(op.route, desc, op.dst, op.len, t) ||
                    t.rkey != op.remote_key) {
                    no.push_back(refusal(op.token, PXN_ESTALE,
                                         "segment " + std::to_string(op.route) +
                                             " no longer holds the range"));
                    continue;
                }
                id = op.route;
            } else {
                std::lock_guard<std::mutex> g(seg_mu);
                auto it = names.find(op.target);
                if (it == names.end()) {
                    no.push_back(refusal(
                        op.token, PXN_EINVAL,
                        std::string("unknown segment ") + op.target));
                    continue;
                }
                id = it->second;
            }
            TransferRequest r;
            r.opcode = op.read ? TransferRequest::READ : TransferRequest::WRITE;
            r.source = op.src;
            r.target_id = id;
            r.target_offset = op.dst;
            r.length = op.len;
            ob->requests.push_back(r);
            ob->tokens.push_back(op.token);
        }
        if (!no.empty()) {
            std::lock_guard<std::mutex> g(op_mu);
            refused.insert(refused.end(), no.begin(), no.end());
        }
        size_t n = ob->requests.size();
        if (n == 0) {
            delete ob;
            return PXN_OK;
        }
        ob->id = owner.allocateBatchID(n);
        ob->state.assign(n, 0);
        ob->open = n;
        auto &bd = Transport::toBatchDesc(ob->id);
        std::vector<TransferTask *> list;
        list.reserve(n);
        for (size_t i = 0; i < n; i++) {
            auto &task = bd.task_list.emplace_back();
            task.batch_id = ob->id;
            task.request = &ob->requests[i];
            list.push_back(&task);
        }
        // A request RdmaTransport cannot post fails its task; poll reports
        // it like any failed write.
        Status s = owner.RdmaTransport::submitTransferTask(list);
        if (!s.ok()) {
            LOG_EVERY_N(WARNING, 1000)
                << "PXN: RDMA refused part of a submit: " << s.ToString();
        }
        std::lock_guard<std::mutex> g(op_mu);
        live.push_back(ob);
        return PXN_OK;
    }

    // The Piece path.
    //
    // A relayed Piece's ops are checked and resolved first, so a Piece the
    // host refuses posts nothing; then cut into slices of at most
    // kPieceSliceMax inside the op's target buffer, carrying the arena's
    // key, the route's remote key and peer NIC path, and posted through
    // RdmaTransport::submitPreparedSlices on this process's one NIC. The
    // slot's task counts them; poll reports the Piece once they are all
    // final. In the steady state (a slot free, every route cached) it looks
    // nothing up and allocates nothing.

    // The route for op, from the cache or resolved into it; PXN_OK, or why
    // the op cannot go. Entries the earlier ops of p point at stay where
    // they are. piece_mu held.
    int routeFor(const PieceSlot &p, const pxn_transport_op &op, int64_t now,
                 SegmentID &id, std::vector<Route> *&list, size_t &index,
                 std::string &why) {
        bool routed = (op.flags & PXN_OP_ROUTED) != 0;
        if (routed) {
            id = op.route;
        } else {
            std::lock_guard<std::mutex> g(seg_mu);
            auto it = names.find(op.target);
            if (it == names.end()) {
                why = std::string("unknown segment ") + op.target;
                return PXN_EINVAL;
            }
            id = it->second;
        }
        auto it = routes.find(id);
        if (it == routes.end())
            it = routes.emplace(id, std::vector<Route>()).first;
        list = &it->second;
        size_t stale = list->size();
        for (size_t i = 0; i < list->size(); i++) {
            const Route &r = (*list)[i];
            if (op.dst < r.base || op.dst - r.base > r.length ||
                op.len > r.length - (op.dst - r.base))
                continue;
            if ((routed && r.rkey != op.remote_key) ||
                now - r.resolved > kRouteMaxAgeNs) {
                stale = i;
                break;
            }
            index = i;
            return PXN_OK;
        }
        route_misses++;
        auto desc = owner.metadata_->getSegmentDescByID(id);
        Target t;
        if (!desc || !target(id, desc, op.dst, op.len, t) ||
            t.device >= desc->devices.size() ||
            (routed && t.rkey != op.remote_key)) {
            if (stale < list->size()) {
                list->erase(list->begin() + stale);
                route_drops++;
            }
            why = "segment " + std::to_string(id) +
                  " no longer holds the range with that key";
            return routed ? PXN_ESTALE : PXN_EINVAL;
        }
        if (stale == list->size()) {
            bool in_use = false;
            for (const auto &h : p.hops) in_use = in_use || h.list == list;
            if (list->size() >= kMaxRoutesPerSegment && !in_use) list->clear();
            stale = list->size();
            list->emplace_back();
        }
        Route &r = (*list)[stale];
        r.base = t.base;
        r.length = t.length;
        r.rkey = t.rkey;
        r.peer_nic_path = MakeNicPath(desc->nicPathServerName(),
                                      desc->devices[t.device].name);
        r.resolved = now;
        index = stale;
        return PXN_OK;
    }

    // A slot whose batch, task and vectors are ready; piece_mu held.
    PieceSlot *takeSlot() {
        if (!free_slots.empty()) {
            PieceSlot *p = free_slots.back();
            free_slots.pop_back();
            return p;
        }
        auto *p = new PieceSlot;
        p->batch = owner.Transport::allocateBatchID(1);
        auto &bd = Transport::toBatchDesc(p->batch);
        p->task = &bd.task_list.emplace_back();
        p->task->batch_id = p->batch;
        p->task->is_finished = true;
        slots_made++;
        // Returning a slot or flying one never allocates.
        free_slots.reserve(slots_made);
        flying.reserve(slots_made);
        return p;
    }

    // Readies p's task and batch to count n slices of bytes in all.
    static void armTask(PieceSlot &p, uint64_t n, uint64_t bytes) {
        TransferTask &t = *p.task;
        t.slice_count = n;
        t.success_slice_count = 0;
        t.failed_slice_count = 0;
        t.transferred_bytes = 0;
        t.is_finished = false;
        t.total_bytes = bytes;
        auto &bd = Transport::toBatchDesc(p.batch);
        bd.has_failure.store(false, std::memory_order_relaxed);
        bd.is_finished.store(false, std::memory_order_relaxed);
#ifdef USE_EVENT_DRIVEN_COMPLETION
        t.completed_slice_count = 0;
        t.submission_sealed = true;
        t.completion_published = false;
        bd.finished_task_count.store(0, std::memory_order_relaxed);
#endif
    }

    int submitPiece(const pxn_transport_op *ops, size_t count,
                    uint64_t token) {
        if (count == 0) return PXN_EINVAL;
        std::lock_guard<std::mutex> g(piece_mu);
        int64_t now = getCurrentTimeInNano();
        uint64_t slice_max = kPieceSliceMax;
        if (globalConfig().slice_size > 0 &&
            globalConfig().slice_size < slice_max)
            slice_max = globalConfig().slice_size;
        if (routes.size() >= kMaxRouteSegments) routes.clear();
        PieceSlot *p = takeSlot();
        p->hops.clear();
        p->used.clear();
        p->reported = false;
        p->token = token;
        bool grew = false;
        if (p->hops.capacity() < count) {
            p->hops.reserve(count);
            p->used.reserve(count);
            grew = true;
        }
        uint64_t n = 0, bytes = 0;
        std::string why;
        for (size_t i = 0; i < count; i++) {
            const auto &op = ops[i];
            auto src = reinterpret_cast<uintptr_t>(op.src);
            int rc = PXN_OK;
            if (op.len == 0) {
                rc = PXN_EINVAL;
                why = "an empty op";
            } else if (!(op.flags & PXN_OP_LOCAL_KEY) &&
                       (src < arena_base || src - arena_base > arena_len ||
                        op.len > arena_len - (src - arena_base))) {
                rc = PXN_EINVAL;
                why = "an op from outside the staging arena without a key";
            }
            SegmentID id = 0;
            std::vector<Route> *list = nullptr;
            size_t index = 0;
            if (rc == PXN_OK) rc = routeFor(*p, op, now, id, list, index, why);
            if (rc != PXN_OK) {
                free_slots.push_back(p);
                piece_refused.push_back(refusal(token, rc, why));
                return PXN_OK;
            }
            p->hops.push_back(PieceSlot::Hop{id, list, index});
            uint64_t base = (*list)[index].base;
            if (p->used.empty() || p->used.back().first != id ||
                p->used.back().second != base)
                p->used.emplace_back(id, base);
            n += (op.len + slice_max - 1) / slice_max;
            bytes += op.len;
        }
        if (p->slices.size() < n) {
            while (p->slices.size() < n) p->slices.push_back(new Slice());
            p->post.reserve(n);
            grew = true;
        }
        if (grew) slot_grows++;
        p->post.clear();
        armTask(*p, n, bytes);
        int max_retry = globalConfig().retry_cnt;
        size_t k = 0;
        for (size_t i = 0; i < count; i++) {
            const auto &op = ops[i];
            const auto &hop = p->hops[i];
            const Route &r = (*hop.list)[hop.index];
            uint64_t lkey = (op.flags & PXN_OP_LOCAL_KEY) ? op.local_key
                                                          : arena_lkey;
            auto opcode = op.read ? TransferRequest::READ : TransferRequest::WRITE;
            for (uint64_t off = 0; off < op.len; off += slice_max) {
                Slice *s = p->slices[k++];
                s->source_addr = static_cast<char *>(op.src) + off;
                s->length = std::min(slice_max, op.len - off);
                s->opcode = opcode;
                s->target_id = hop.id;
                s->peer_nic_path = r.peer_nic_path;
                s->source_location.clear();
                s->status = Slice::PENDING;
                s->task = p->task;
                s->from_cache = false;
                s->cleanup_callback = nullptr;
                s->rdma.dest_addr = op.dst + off;
                s->rdma.source_lkey = static_cast<Slice::mr_key_t>(lkey);
                s->rdma.dest_rkey = static_cast<Slice::mr_key_t>(r.rkey);
                s->rdma.retry_cnt = 0;
                s->rdma.max_retry_cnt = max_retry;
                s->ts = 0;
                p->post.push_back(s);
            }
        }
        flying.push_back(p);
        pieces++;
        if (owner.RdmaTransport::submitPreparedSlices(
                static_cast<int>(local_hca_index), p->post) != 0) {
            // No active device took them: each fails, and the Piece with
            // them.
            for (Slice *s : p->post) s->markFailed();
        }
        return PXN_OK;
    }

    // Drops the cached routes p used; piece_mu held.
    void dropRoutes(const PieceSlot &p) {
        for (const auto &[id, base] : p.used) {
            auto it = routes.find(id);
            if (it == routes.end()) continue;
            auto &list = it->second;
            for (size_t i = 0; i < list.size(); i++) {
                if (list[i].base != base) continue;
                list.erase(list.begin() + i);
                route_drops++;
                break;
            }
        }
    }

    // Reports ended Pieces, at most capacity (out NULL: none reported,
    // for close), and returns finished slots to the pool; piece_mu held.
    size_t reapPieces(pxn_transport_completion *out, size_t capacity) {
        size_t n = 0;
        while (n < capacity && out != nullptr && !piece_refused.empty()) {
            out[n++] = piece_refused.back();
            piece_refused.pop_back();
        }
        for (size_t i = 0; i < flying.size();) {
            PieceSlot *p = flying[i];
            const TransferTask &t = *p->task;
            uint64_t ok = __atomic_load_n(&t.success_slice_count, __ATOMIC_ACQUIRE);
            uint64_t bad = __atomic_load_n(&t.failed_slice_count, __ATOMIC_ACQUIRE);
            bool done = ok + bad == t.slice_count;
            if (!p->reported && out != nullptr) {
                if (n == capacity) {
                    i++;
                    continue;
                }
                if (done) {
                    out[n++] = bad == 0 ? refusal(p->token, PXN_OK, "")
                                        : refusal(p->token, PXN_EIO,
                                                  "RDMA write failed");
                    if (bad != 0) dropRoutes(*p);
                } else if (timedOut(p->post)) {
                    out[n++] = refusal(p->token, PXN_ETIMEDOUT,
                                       "RDMA slice timed out");
                    p->reported = true;
                    dropRoutes(*p);
                }
            }
            if (!done) {
                i++;
                continue;
            }
            p->task->is_finished = true;
            flying[i] = flying.back();
            flying.pop_back();
            free_slots.push_back(p);
        }
        return n;
    }

    size_t pollPieces(pxn_transport_completion *out, size_t capacity) {
        std::lock_guard<std::mutex> g(piece_mu);
        return reapPieces(out, capacity);
    }

    // Frees the pooled slots; those RDMA still holds are left, with their
    // slices and batches, as the NIC may still complete them.
    void freeSlots() {
        std::lock_guard<std::mutex> g(piece_mu);
        reapPieces(nullptr, 0);
        for (PieceSlot *p : free_slots) {
            for (Slice *s : p->slices) delete s;
            owner.Transport::freeBatchID(p->batch);
            delete p;
        }
        free_slots.clear();
        if (!flying.empty())
            LOG(WARNING) << "PXN: " << flying.size()
                         << " relayed Pieces still held by RDMA are left "
                            "allocated";
    }

    // Whether a slice of slices was posted longer than MultiTransport's
    // slice timeout ago: a task's (per-op path) or a Piece's.
    static bool timedOut(const std::vector<Slice *> &slices) {
        if (globalConfig().slice_timeout <= 0) return false;
        int64_t now = getCurrentTimeInNano();
        int64_t limit = globalConfig().slice_timeout * 1000000000;
        for (const Slice *s : slices) {
            int64_t ts = s->ts;
            if (ts > 0 && now > ts && now - ts > limit) return true;
        }
        return false;
    }

    bool finished(OpBatch *ob) {
        auto &bd = Transport::toBatchDesc(ob->id);
        for (auto &t : bd.task_list)
            if (!t.is_finished) return false;
        return true;
    }

    // Reports what finished in ob, at most cap completions into out (out
    // NULL: every one, reported nowhere); op_mu held.
    size_t reap(OpBatch *ob, pxn_transport_completion *out, size_t cap) {
        size_t n = 0;
        for (size_t i = 0; i < ob->state.size(); i++) {
            if (ob->state[i] == 1) continue;
            TransferStatus st;
            owner.RdmaTransport::getTransferStatus(ob->id, i, st);
            bool done = st.s == TransferStatusEnum::COMPLETED ||
                        st.s == TransferStatusEnum::FAILED;
            if (ob->state[i] == 2) {
                if (done) ob->state[i] = 1;
                continue;
            }
            if (out != nullptr && n == cap) continue;
            auto &task = Transport::toBatchDesc(ob->id).task_list[i];
            if (done) {
                if (out != nullptr)
                    out[n] = st.s == TransferStatusEnum::COMPLETED
                                 ? refusal(ob->tokens[i], PXN_OK, "")
                                 : refusal(ob->tokens[i], PXN_EIO,
                                           "RDMA write failed");
                n++;
                ob->state[i] = 1;
                ob->open--;
            } else if (timedOut(task.slice_list)) {
                if (out != nullptr)
                    out[n] = refusal(ob->tokens[i], PXN_ETIMEDOUT,
                                     "RDMA slice timed out");
                n++;
                ob->state[i] = 2;
                ob->open--;
            }
        }
        return n;
    }

    size_t pollOps(pxn_transport_completion *out, size_t capacity) {
        std::lock_guard<std::mutex> g(op_mu);
        size_t n = 0;
        while (n < capacity && !refused.empty()) {
            out[n++] = refused.back();
            refused.pop_back();
        }
        for (size_t i = 0; i < live.size();) {
            OpBatch *ob = live[i];
            n += reap(ob, out + n, capacity - n);
            if (ob->open == 0 && finished(ob)) {
                owner.Transport::freeBatchID(ob->id);
                delete ob;
                live[i] = live.back();
                live.pop_back();
                continue;
            }
            i++;
        }
        return n;
    }

    // Mooncake tasks.

    bool eligible(const TransferTask &t, pxn_request &r,
                  std::shared_ptr<SegmentDesc> &desc) {
        if (t.request == nullptr || t.request_count != 1) return false;
        const auto &q = t.request[0];
        if (q.opcode != TransferRequest::WRITE || q.length == 0 ||
            q.target_id == LOCAL_SEGMENT_ID)
            return false;
        if (!isDevice(q.source, q.length)) return false;
        desc = owner.metadata_->getSegmentDescByID(q.target_id);
        if (!desc || desc->name.empty() || desc->name.size() > PXN_MAX_SESSION)
            return false;
        Target tg;
        if (!target(q.target_id, desc, q.target_offset, q.length, tg))
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

    void route(const std::vector<TransferTask *> &in,
               std::vector<TransferTask *> &direct) {
        std::vector<TransferTask *> mine;
        std::vector<pxn_request> reqs;
        std::vector<std::shared_ptr<SegmentDesc>> keep;
        for (auto *t : in) {
            pxn_request r;
            std::shared_ptr<SegmentDesc> desc;
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
        if (api.submit(handle, reqs.data(), reqs.size(), &b) != PXN_OK) {
            LOG_EVERY_N(WARNING, 1000)
                << "PXN: pxn_submit refused " << reqs.size()
                << " writes, sent direct: " << api.lastError();
            direct.insert(direct.end(), mine.begin(), mine.end());
            return;
        }
        auto *sub = new Submission{b, {mine.size()}};
        live_submissions++;
        int64_t now = getCurrentTimeInNano();
        std::lock_guard<std::mutex> g(task_mu);
        for (size_t i = 0; i < mine.size(); i++) {
            auto &task = *mine[i];
            const auto &q = task.request[0];
            Slice *s = Transport::getSliceCache().allocate();
            s->source_addr = q.source;
            s->length = q.length;
            s->opcode = q.opcode;
            s->target_id = q.target_id;
            s->peer_nic_path.clear();
            s->source_location.clear();
            s->rdma.dest_addr = q.target_offset;
            s->rdma.retry_cnt = 0;
            s->task = &task;
            s->status = Slice::POSTED;
            s->ts = now;
            s->cleanup_callback = &pxnTaskSlice;
            task.slice_list.push_back(s);
            task.total_bytes += q.length;
            __sync_fetch_and_add(&task.slice_count, 1);
            tasks[&task] = TaskRef{sub, b, i};
        }
    }

    static Slice *pxnSlice(const TransferTask &t) {
        if (t.slice_list.size() != 1) return nullptr;
        Slice *s = t.slice_list[0];
        return s->cleanup_callback == &pxnTaskSlice ? s : nullptr;
    }

    // Records the final state of a task exactly once, on whichever thread
    // saw it first, and frees the libpxn batch after its last task.
    void finalize(TransferTask &task, Slice &s, int32_t state,
                  uint64_t transferred) {
        TaskRef ref;
        {
            std::lock_guard<std::mutex> g(task_mu);
            auto it = tasks.find(&task);
            if (it == tasks.end()) return;
            ref = it->second;
            tasks.erase(it);
        }
        if (state == PXN_TASK_COMPLETED) {
            s.markSuccess();
        } else {
            __atomic_fetch_add(&task.transferred_bytes, transferred,
                               __ATOMIC_RELAXED);
            // markFailed counts the slice and, in an event-driven build,
            // completes the task and its batch; the mark it cannot carry
            // (it sets FAILED) is written before its count, which readers
            // load with acquire.
            s.rdma.retry_cnt =
                state == PXN_TASK_TIMEOUT ? kTimedOutMark : 0;
            s.markFailed();
        }
        if (ref.sub->open.fetch_sub(1) == 1) {
            if (api.free_batch(handle, ref.batch) != PXN_OK)
                LOG(WARNING) << "pxn_free_batch: " << api.lastError();
            delete ref.sub;
            live_submissions--;
        }
    }

    void status(TransferTask &task, Slice &s, TransferStatus &out) {
        uint64_t ok = __atomic_load_n(&task.success_slice_count, __ATOMIC_ACQUIRE);
        uint64_t bad = __atomic_load_n(&task.failed_slice_count, __ATOMIC_ACQUIRE);
        if (ok + bad != task.slice_count) {
            TaskRef ref{};
            bool mapped;
            {
                std::lock_guard<std::mutex> g(task_mu);
                auto it = tasks.find(&task);
                mapped = it != tasks.end();
                if (mapped) ref = it->second;
            }
            if (mapped) {
                pxn_task_status st{};
                int rc = api.get_status(handle, ref.batch, ref.index, &st);
                if (rc != PXN_OK) {
                    // libpxn may still work on the batch: it is neither
                    // freed nor reported final here. MultiTransport's
                    // slice timeout, or close, ends the task.
                    LOG_EVERY_N(WARNING, 1000)
                        << "pxn_get_status: " << api.lastError();
                    out.s = TransferStatusEnum::WAITING;
                    out.transferred_bytes = task.transferred_bytes;
                    return;
                }
                if (!isFinal(st.state)) {
                    out.s = TransferStatusEnum::WAITING;
                    out.transferred_bytes = st.transferred;
                    return;
                }
                finalize(task, s, st.state, st.transferred);
            }
            ok = __atomic_load_n(&task.success_slice_count, __ATOMIC_ACQUIRE);
            bad = __atomic_load_n(&task.failed_slice_count, __ATOMIC_ACQUIRE);
        }
        out.transferred_bytes = task.transferred_bytes;
        if (ok + bad != task.slice_count) {
            out.s = TransferStatusEnum::WAITING;
            return;
        }
        if (bad == 0)
            out.s = TransferStatusEnum::COMPLETED;
        else if (s.rdma.retry_cnt == kTimedOutMark)
            out.s = TransferStatusEnum::TIMEOUT;
        else
            out.s = TransferStatusEnum::FAILED;
        task.is_finished = true;
    }
};

PxnRdmaTransport::PxnRdmaTransport() = default;

bool PxnRdmaTransport::enabled() { return pxnRequested(); }

std::string PxnRdmaTransport::layoutMismatch() {
    const pxn_layout_field *engine, *mine;
    size_t ne = pxn_mooncake_engine_layout(&engine);
    size_t nm = pxn_mooncake_transport_layout(&mine);
    return pxnLayoutMismatch(engine, ne, mine, nm);
}

PxnRdmaTransport::~PxnRdmaTransport() {
    // libpxn drains through RdmaTransport, which must still be whole.
    pxnClose();
    pxn_.reset();
}

void PxnRdmaTransport::pxnClose() {
    if (pxn_) pxn_->close();
}

int PxnRdmaTransport::install(std::string &local_server_name,
                              std::shared_ptr<TransferMetadata> meta,
                              std::shared_ptr<Topology> topo) {
    std::string skew = layoutMismatch();
    if (!skew.empty()) {
        LOG(ERROR) << "PxnRdmaTransport was compiled with other Mooncake "
                      "struct layouts than the engine (engine first): "
                   << skew
                   << "; build it inside Mooncake's tree with the PXN patch";
        return ERR_INVALID_ARGUMENT;
    }
    int rc = RdmaTransport::install(local_server_name, meta, topo);
    if (rc != 0 || !pxnRequested()) return rc;
    std::string why = "no topology";
    if (topo != nullptr) pxn_ = Engine::open(*this, topo, why);
    if (!pxn_) {
        pxn_off_reason_ = why;
        LOG(WARNING) << "PXN off, RDMA carries every request: " << why;
    }
    return 0;
}

int PxnRdmaTransport::registerLocalMemory(void *addr, size_t length,
                                          const std::string &location,
                                          bool remote_accessible,
                                          bool update_metadata) {
    int rc = RdmaTransport::registerLocalMemory(addr, length, location,
                                                remote_accessible,
                                                update_metadata);
    if (rc == 0 && pxn_) pxn_->noteMemory(addr, length, location);
    return rc;
}

int PxnRdmaTransport::unregisterLocalMemory(void *addr, bool update_metadata) {
    if (pxn_) pxn_->forgetMemory(addr);
    return RdmaTransport::unregisterLocalMemory(addr, update_metadata);
}

int PxnRdmaTransport::registerLocalMemoryBatch(
    const std::vector<BufferEntry> &buffer_list, const std::string &location) {
    int rc = RdmaTransport::registerLocalMemoryBatch(buffer_list, location);
    if (rc == 0 && pxn_)
        for (const auto &b : buffer_list)
            pxn_->noteMemory(b.addr, b.length, location);
    return rc;
}

int PxnRdmaTransport::unregisterLocalMemoryBatch(
    const std::vector<void *> &addr_list) {
    if (pxn_)
        for (auto *a : addr_list) pxn_->forgetMemory(a);
    return RdmaTransport::unregisterLocalMemoryBatch(addr_list);
}

Status PxnRdmaTransport::submitTransferTask(
    const std::vector<TransferTask *> &task_list) {
    if (!pxn_ || pxn_->closed) return RdmaTransport::submitTransferTask(task_list);
    std::vector<TransferTask *> direct;
    direct.reserve(task_list.size());
    pxn_->route(task_list, direct);
    if (direct.empty()) return Status::OK();
    return RdmaTransport::submitTransferTask(direct);
}

Status PxnRdmaTransport::getTransferStatus(BatchID batch_id, size_t task_id,
                                           TransferStatus &status) {
    if (!pxn_) return RdmaTransport::getTransferStatus(batch_id, task_id, status);
    auto &bd = toBatchDesc(batch_id);
    if (task_id >= bd.task_list.size())
        return RdmaTransport::getTransferStatus(batch_id, task_id, status);
    auto &task = bd.task_list[task_id];
    Slice *s = Engine::pxnSlice(task);
    if (s == nullptr)
        return RdmaTransport::getTransferStatus(batch_id, task_id, status);
    pxn_->status(task, *s, status);
    return Status::OK();
}

Status PxnRdmaTransport::getTransferStatus(
    BatchID batch_id, std::vector<TransferStatus> &status) {
    if (!pxn_) return RdmaTransport::getTransferStatus(batch_id, status);
    auto &bd = toBatchDesc(batch_id);
    status.resize(bd.task_list.size());
    for (size_t i = 0; i < bd.task_list.size(); i++) {
        Status s = getTransferStatus(batch_id, i, status[i]);
        if (!s.ok()) return s;
    }
    return Status::OK();
}

PxnRdmaTransport::PxnStats PxnRdmaTransport::pxnStats() const {
    PxnStats st;
    if (!pxn_) return st;
    auto &e = *pxn_;
    st.active = !e.closed;
    {
        std::lock_guard<std::mutex> g(e.task_mu);
        st.tasks = e.tasks.size();
    }
    st.pxn_batches = e.live_submissions.load();
    {
        std::lock_guard<std::mutex> g(e.op_mu);
        st.op_batches = e.live.size();
    }
    {
        std::lock_guard<std::mutex> g(e.piece_mu);
        st.op_batches += e.flying.size();
        st.piece_slots = e.slots_made;
        st.piece_slot_grows = e.slot_grows;
    }
    st.pieces = e.pieces.load();
    st.route_misses = e.route_misses.load();
    st.route_drops = e.route_drops.load();
    pxn_counters c{};
    c.struct_size = sizeof c;
    if (!e.closed && e.api.get_counters(e.handle, &c) == PXN_OK) {
        st.relayed_bytes = c.relayed_bytes;
        st.relayed_pieces = c.relayed_pieces;
        st.fallback_bytes = c.fallback_bytes;
        st.fallback_pieces = c.fallback_pieces;
        st.direct_bytes = c.direct_bytes;
        st.forwarded_bytes = c.forwarded_bytes;
        st.forwarded_pieces = c.forwarded_pieces;
        st.second_hop_failures = c.second_hop_failures;
        st.copier = c.copier;
        st.live_batches = c.live_batches;
    }
    return st;
}

bool PxnRdmaTransport::pxnWaitRelay(const std::string &rail,
                                    uint32_t timeout_ms) {
    if (!pxn_ || pxn_->closed) return false;
    return pxn_->api.wait_relay(pxn_->handle, rail.c_str(), timeout_ms) ==
           PXN_OK;
}

}  // namespace mooncake
