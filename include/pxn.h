// SPDX-License-Identifier: Apache-2.0

/*
 * pxn.h: the C ABI of libpxn, the PXN engine as a shared library.
 *
 * A host transfer engine (Mooncake's first) opens one engine per process,
 * hands it a table of callbacks for its own transport, and submits batches of
 * writes and reads through it. Cross-rail writes from device memory are
 * staged through a relay on the target's rail; everything else goes straight
 * to the host's transport. docs/c-abi.md is the reference: ownership, threads,
 * blocking and error rules are stated there once and summarized here.
 *
 * Every function is thread-safe, never aborts the process, and reports
 * failure as a negative PXN_* code with a per-thread message
 * (pxn_last_error). Handles are integers checked on every call: a stale or
 * made-up handle yields PXN_EINVAL.
 */
#ifndef PXN_H
#define PXN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * 3 added route handles and keys, arena registration, Mooncake's task
 * states and the live-batch bound; 4 the transport's optional submit_piece.
 * A host built against an older header keeps working: it passes an older
 * PXN_OPTIONS_VERSION or a shorter pxn_transport, and the engine then speaks
 * that version's structs and states (docs/c-abi.md, "Versions").
 */
#define PXN_API_VERSION 4

/* Result codes. PXN_OK is success; every failure is negative. */
#define PXN_OK 0
/* A bad argument, handle, or struct size. */
#define PXN_EINVAL (-1)
/*
 * Not now: a transport that cannot take more work returns it from submit; a
 * batch with pending tasks cannot be freed.
 */
#define PXN_BUSY (-2)
/* Asked for something this build or this process cannot do. */
#define PXN_ENOTSUP (-3)
/* The engine is closing. */
#define PXN_ECLOSED (-4)
/* The engine or the host's transport failed. */
#define PXN_EIO (-5)
/* A wait or a drain ran out of time. */
#define PXN_ETIMEDOUT (-6)
/* A defect inside libpxn, caught before it could reach the host. */
#define PXN_EINTERNAL (-7)
/*
 * Since PXN_API_VERSION 3. pxn_submit: the engine holds as many live batches
 * as it may (pxn_options.max_batches); batches whose tasks are final must be
 * freed with pxn_free_batch.
 */
#define PXN_ETOOMANY (-8)
/*
 * Since PXN_API_VERSION 3. For a transport completion: the op's route handle
 * is no longer valid (the host dropped or replaced it), so nothing was
 * written. The engine drops its cached route and resolves the target again.
 */
#define PXN_ESTALE (-9)

/*
 * Task states. The values are those of Mooncake's
 * Transport::TransferStatusEnum, in the same order, so a Mooncake transport
 * can cast one to the other. An engine opened with PXN_OPTIONS_VERSION 2
 * reports every unfinished task as WAITING, as Mooncake's RdmaTransport does
 * (MultiTransport applies its slice timeout to WAITING tasks only); one
 * opened with version 1 reports them as PENDING, as API version 2 did.
 * TIMEOUT: the transport or a relay's second hop timed out, or a relay made
 * no progress on a staged Piece. INVALID: the transport refused the op as
 * PXN_EINVAL. Any other failure is FAILED.
 */
#define PXN_TASK_WAITING 0
#define PXN_TASK_PENDING 1
#define PXN_TASK_INVALID 2
#define PXN_TASK_CANCELED 3
#define PXN_TASK_COMPLETED 4
#define PXN_TASK_TIMEOUT 5
#define PXN_TASK_FAILED 6

#define PXN_OP_WRITE 0
#define PXN_OP_READ 1

#define PXN_MEM_HOST 0
#define PXN_MEM_DEVICE 1

/*
 * First-hop copier. DEFAULT is CUDA when libcuda.so.1 loads and reports a
 * device, HOST otherwise; pxn_counters.copier says which one runs. CUDA
 * without a driver fails pxn_open with PXN_ENOTSUP.
 */
#define PXN_COPIER_DEFAULT 0
#define PXN_COPIER_HOST 1
#define PXN_COPIER_CUDA 2

/* 2 appended arena registration, max_batches, flags and cuda_device. */
#define PXN_OPTIONS_VERSION 2

/* pxn_options.flags. */
/* cuda_device names the GPU of the CUDA copier and arena. */
#define PXN_OPEN_CUDA_DEVICE 0x1u

/* Live batches an engine holds when pxn_options.max_batches is 0. */
#define PXN_DEFAULT_MAX_BATCHES 65536u

/* pxn_transport_op.flags (since PXN_API_VERSION 3). */
/* A relay's second hop: src lies in this rank's staging arena. */
#define PXN_OP_RELAYED 0x1u
/* local_key holds the key pxn_register_arena_fn returned for src's arena. */
#define PXN_OP_LOCAL_KEY 0x2u
/* route and remote_key hold what the host's directory gave for target and dst. */
#define PXN_OP_ROUTED 0x4u

/* Longest target session name, in bytes, without the terminating NUL. */
#define PXN_MAX_SESSION 256
/* Size of an HCA name buffer, including the terminating NUL. */
#define PXN_HCA_NAME_MAX 64
/* Size of a transport completion's message buffer, including the NUL. */
#define PXN_MESSAGE_MAX 112
/* Size of the per-thread error message buffer, including the NUL. */
#define PXN_ERROR_MAX 512

/* Handles. 0 is never a valid handle. */
typedef uint64_t pxn_engine_t;
typedef uint64_t pxn_batch_t;

/*
 * One transfer handed to the host's transport: the direct path, a relay's
 * second hop, or a fallback. Write: len bytes from local src to dst in the
 * target session. Read: len bytes from dst in the target session to local src.
 * The array and every target string are valid only during the submit call.
 *
 * An engine opened with PXN_OPTIONS_VERSION 1 passes ops of API version 2's
 * layout: the fields up to flags (then reserved, always 0), 48 bytes apart.
 */
typedef struct pxn_transport_op {
	void *src;
	uint64_t len;
	const char *target;
	uint64_t dst;
	/* Opaque; returned unchanged in the op's completion. */
	uint64_t token;
	/* 0 = write, 1 = read. */
	uint32_t read;
	/* PXN_OP_*; 0 on the direct path and for fallbacks. */
	uint32_t flags;
	/*
	 * Since PXN_API_VERSION 3, valid with PXN_OP_ROUTED: the route handle the
	 * host's directory returned for target (pxn_target_info.route), and the
	 * remote key of the registered range that holds dst..dst+len. A host that
	 * no longer honours the handle must fail the op (PXN_ESTALE), never write
	 * through whatever the handle now means.
	 */
	uint64_t route;
	uint64_t remote_key;
	/* Valid with PXN_OP_LOCAL_KEY: the registration key of src's arena. */
	uint64_t local_key;
} pxn_transport_op;

/*
 * Filled by the transport's poll, in an array the engine owns. message is
 * read only when status is not PXN_OK, up to its first NUL or
 * PXN_MESSAGE_MAX bytes. status PXN_ETIMEDOUT makes a direct task TIMEOUT,
 * PXN_EINVAL makes it INVALID; any other failure makes it FAILED.
 * PXN_ETIMEDOUT is not final: the transport reports it while its NIC may
 * still hold the op, and reports the same token once more, with the op's
 * final status, when the NIC's completion or its queue pair's flush comes.
 * Until then a relayed op keeps its staging slot and counts toward the
 * arena's use (pxn_close); every other status is final.
 */
typedef struct pxn_transport_completion {
	uint64_t token;
	int32_t status;
	uint32_t reserved;
	char message[PXN_MESSAGE_MAX];
} pxn_transport_completion;

/*
 * Takes all of ops or none. Returns PXN_OK when it took them, PXN_BUSY when it
 * cannot take them now (the engine retries later), or another negative code,
 * which fails them. It must not block, and a transport with nothing in
 * flight must take a submit of any size.
 */
typedef int (*pxn_transport_submit_fn)(void *user, const pxn_transport_op *ops, size_t count);

/*
 * Writes up to capacity completions to out and returns how many. It must not
 * block. Never called concurrently with itself for one engine.
 */
typedef size_t (*pxn_transport_poll_fn)(void *user, pxn_transport_completion *out, size_t capacity);

/*
 * Since PXN_API_VERSION 4, optional: takes all count ops of one relayed Piece
 * (at most 4096, each flagged PXN_OP_RELAYED; their token fields are 0) in
 * one call, and reports their end with ONE completion carrying token, whose
 * status is the first failed op's (PXN_OK when all succeeded). Returns as
 * submit does: PXN_OK, PXN_BUSY when it takes none of them now (the engine
 * offers the whole Piece again later), or another negative code, which fails
 * the Piece. A transport that has it counts a Piece, not its ops, toward
 * whatever bounds its queue. It must not block. Without it, a Piece's ops go
 * through submit in chunks, a token and a completion each.
 */
typedef int (*pxn_transport_submit_piece_fn)(void *user, const pxn_transport_op *ops, size_t count, uint64_t token);

/*
 * The host's transport. pxn_open copies the table; user must outlive the
 * engine. A table of API version 3 ends at poll (struct_size 32 on LP64).
 */
typedef struct pxn_transport {
	uint32_t struct_size;
	uint32_t reserved;
	void *user;
	pxn_transport_submit_fn submit;
	pxn_transport_poll_fn poll;
	/* Since PXN_API_VERSION 4; NULL: relayed ops go through submit. */
	pxn_transport_submit_piece_fn submit_piece;
} pxn_transport;

/*
 * What a directory knows of one target address: how many HCAs serve it (PXN
 * relays only when exactly one does), the raw name of the first, and the
 * registered range that holds it.
 */
typedef struct pxn_target_info {
	uint32_t hca_count;
	uint32_t reserved;
	char hca[PXN_HCA_NAME_MAX];
	uint64_t range_base;
	uint64_t range_len;
	/*
	 * Since PXN_API_VERSION 3. route: the host's own handle for the path to
	 * this target (an endpoint, a queue-pair set), opaque to the engine; 0
	 * means none. remote_key: the key the host's transport needs to write
	 * into the range (an RDMA rkey), read only when route is not 0. The
	 * relay keeps both with its cached route and passes them in every
	 * second-hop op (PXN_OP_ROUTED), so the host need not look the target up
	 * per op; pxn_invalidate_target, or a failed op, drops them.
	 */
	uint64_t route;
	uint64_t remote_key;
} pxn_target_info;

/*
 * Resolves session and dst. out is zeroed by the engine and valid only during
 * the call. Returns PXN_OK, or a negative code when the target is unknown
 * (the request then goes direct). It must not block.
 */
typedef int (*pxn_resolve_fn)(void *user, const char *session, uint64_t dst, pxn_target_info *out);

/*
 * Registers the engine's staging arena, [addr, addr+len) of kind PXN_MEM_*
 * (device memory with the CUDA copier), with the host's NIC, and stores in
 * *local_key the key the host's transport needs to read from it (an RDMA
 * lkey). Called once during pxn_open, after the arena is allocated and before
 * any peer can see this rank. A negative return means the arena is not
 * registered: this rank then does not relay (its peers send to its rail
 * direct), the engine logs why once, and the arena stays allocated until the
 * process exits, as a NIC may hold part of it.
 */
typedef int (*pxn_register_arena_fn)(void *user, void *addr, uint64_t len, int kind, uint64_t *local_key);

/*
 * Undoes pxn_register_arena_fn for the same range and key, during pxn_close,
 * once no second-hop op reads from the arena. A negative return keeps the
 * arena allocated until the process exits.
 */
typedef int (*pxn_deregister_arena_fn)(void *user, void *addr, uint64_t len, uint64_t local_key);

/*
 * Options of pxn_open. Set struct_size to sizeof(pxn_options) and version to
 * PXN_OPTIONS_VERSION; later versions only append fields. Everything is copied
 * or read during pxn_open except the user pointers, which must stay valid
 * until pxn_close returns. Version 1 (API version 2) ends at reserved.
 */
typedef struct pxn_options {
	uint32_t struct_size;
	uint32_t version;
	/* Raw name of the one HCA this process uses; NULL or "" turns PXN off. */
	const char *local_hca;
	/* Required: submit and poll must be set. */
	const pxn_transport *transport;
	/* NULL: targets come from pxn_register_target. */
	pxn_resolve_fn resolve;
	void *resolve_user;
	/* PXN_COPIER_*. */
	uint32_t copier;
	uint32_t reserved;
	/*
	 * Since PXN_OPTIONS_VERSION 2. Both NULL: the arena is not registered
	 * (a transport that needs no registration); one NULL is an error.
	 */
	pxn_register_arena_fn register_arena;
	pxn_deregister_arena_fn deregister_arena;
	void *arena_user;
	/* Most live batches; 0 is PXN_DEFAULT_MAX_BATCHES. */
	uint32_t max_batches;
	/* PXN_OPEN_*. */
	uint32_t flags;
	/*
	 * With PXN_OPEN_CUDA_DEVICE: the CUDA device ordinal of the copier and
	 * arena. Without it: the device of the calling thread's current
	 * context, else device 0.
	 */
	int32_t cuda_device;
	uint32_t reserved2;
} pxn_options;

/*
 * One request of a batch. stream is the CUDA stream (a CUstream or
 * cudaStream_t of the device's primary context) on which src becomes ready:
 * the engine records an event on it at pxn_submit and stages nothing before
 * the event completes. NULL is the legacy default stream. On the host path
 * (PXN_COPIER_HOST) src counts as ready when pxn_submit is called.
 */
typedef struct pxn_request {
	/* PXN_OP_WRITE or PXN_OP_READ. */
	uint32_t op;
	uint32_t reserved;
	void *src;
	uint64_t len;
	/* NUL-terminated target session, 1..PXN_MAX_SESSION bytes; copied. */
	const char *target;
	uint64_t dst;
	void *stream;
} pxn_request;

typedef struct pxn_task_status {
	/* PXN_TASK_*. */
	int32_t state;
	uint32_t reserved;
	/*
	 * Bytes moved so far: it grows as each staged Piece (up to 8 MiB) or
	 * direct op of the task completes, and equals the request's len once
	 * COMPLETED.
	 */
	uint64_t transferred;
} pxn_task_status;

/*
 * A snapshot of the engine's counters. Set struct_size before the call; the
 * engine fills at most that many bytes and writes back how many it filled.
 */
typedef struct pxn_counters {
	uint32_t struct_size;
	/* 1 while cross-rail writes may take the PXN path. */
	uint32_t pxn_active;
	/* Staged in a relay and completed by it (this rank as sender). */
	uint64_t relayed_bytes;
	uint64_t relayed_pieces;
	/* Meant for a relay, sent direct before their doorbell. */
	uint64_t fallback_bytes;
	uint64_t fallback_pieces;
	/* Sent direct at classification (reads included). */
	uint64_t direct_bytes;
	uint64_t credit_waits;
	uint64_t second_hop_failures;
	/* Forwarded by this rank as a relay for its peers. */
	uint64_t forwarded_bytes;
	uint64_t forwarded_pieces;
	uint64_t invalid_descs;
	uint64_t failed_pieces;
	uint64_t lane_quarantines;
	/* Since PXN_API_VERSION 3. */
	/* The first-hop copier in use (PXN_COPIER_HOST or _CUDA); 0 with PXN off. */
	uint64_t copier;
	/* Batches submitted and not yet freed. */
	uint64_t live_batches;
	/*
	 * Since PXN_API_VERSION 4. MC_PXN_* values refused at pxn_open (each
	 * logged with its value); any is why pxn_active is 0.
	 */
	uint64_t config_refused;
} pxn_counters;

#ifndef PXN_NO_PROTOTYPES

/*
 * The PXN_API_VERSION the library was built with: at least the version of
 * the header a host was built against when the library can serve it.
 */
uint32_t pxn_api_version(void);

/*
 * Opens an engine configured by the MC_PXN_* environment variables (read with
 * getenv during the call) and opts. Any PXN problem is logged once and leaves
 * an engine that sends everything direct; only a bad opts fails.
 */
int pxn_open(const pxn_options *opts, pxn_engine_t *out);

/*
 * Drains in-flight work for up to timeout_ms, fails what is left, withdraws
 * the rank and releases the engine and all its batches. The handle is
 * released even when the result is an error (PXN_ETIMEDOUT: work was left).
 * When the host's transport still holds second-hop ops after the drain, the
 * staging arena is neither deregistered (no deregister_arena call) nor freed:
 * it stays allocated until the process exits, and the result is an error.
 */
int pxn_close(pxn_engine_t engine, uint32_t timeout_ms);

/*
 * Marks [addr, addr+len) as host or device memory (PXN_MEM_*). With the CUDA
 * copier a device range must lie in one allocation (cuMemAlloc, cudaMalloc,
 * or a cuMemCreate mapping) of the engine's GPU; cross-rail writes from any
 * device memory of that GPU take the PXN path whether registered or not.
 */
int pxn_register_memory(pxn_engine_t engine, void *addr, uint64_t len, int kind);

/*
 * Adds a registered range of a target session served by the HCA named hca.
 * Only for engines opened without a resolve callback.
 */
int pxn_register_target(pxn_engine_t engine, const char *session, const char *hca, uint64_t base, uint64_t len);

/*
 * pxn_register_target with what pxn_target_info carries since API version 3:
 * hca_count must be 1, and route and remote_key, when route is not 0, are
 * passed in the relay's second-hop ops to the range. Since PXN_API_VERSION 3.
 */
int pxn_register_target_info(pxn_engine_t engine, const char *session, const pxn_target_info *info);

/* Forgets every range of session. */
int pxn_unregister_target(pxn_engine_t engine, const char *session);

/*
 * Tells the engine that what the host's directory says of session has
 * changed (new keys, ranges moved, the session gone): the relay drops its
 * cached route and resolves the session again for its next Piece. NULL or ""
 * drops every cached route. pxn_unregister_target does this on its own.
 * Since PXN_API_VERSION 2.
 */
int pxn_invalidate_target(pxn_engine_t engine, const char *session);

/*
 * Starts count requests as one batch. Either every request is accepted and
 * *out is the new batch, or none is (PXN_EINVAL names the first bad one).
 */
int pxn_submit(pxn_engine_t engine, const pxn_request *reqs, size_t count, pxn_batch_t *out);

/* The state of task index of batch; with PXN off it polls the transport first. */
int pxn_get_status(pxn_engine_t engine, pxn_batch_t batch, size_t index, pxn_task_status *out);

/*
 * Releases a batch whose tasks are all final; PXN_BUSY while any is not. The
 * host frees every batch it submitted: the engine never frees one on its own
 * before pxn_close, and pxn_submit fails with PXN_ETOOMANY once max_batches
 * are live.
 */
int pxn_free_batch(pxn_engine_t engine, pxn_batch_t batch);

/* With PXN off, polls the transport and retries busy submits; else a no-op. */
int pxn_progress(pxn_engine_t engine);

int pxn_get_counters(pxn_engine_t engine, pxn_counters *out);

/* 1 when cross-rail writes may take the PXN path, 0 when not, or a code. */
int pxn_is_active(pxn_engine_t engine);

/* 1 when writes to the canonical rail have a live relay, 0 when not, or a code. */
int pxn_has_relay(pxn_engine_t engine, const char *rail);

/*
 * Waits up to timeout_ms for a live relay on rail. PXN_ETIMEDOUT when none
 * came, PXN_ENOTSUP when PXN is off in this process.
 */
int pxn_wait_relay(pxn_engine_t engine, const char *rail, uint32_t timeout_ms);

/*
 * Copies the calling thread's last error message into buf (truncated, always
 * NUL-terminated when len > 0) and returns its full length. buf may be NULL
 * when len is 0.
 */
size_t pxn_last_error(char *buf, size_t len);

/* A static description of a PXN_* result code. */
const char *pxn_strerror(int code);

#endif

#ifdef __cplusplus
}
#endif

#endif
