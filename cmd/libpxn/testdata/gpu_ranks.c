// SPDX-License-Identifier: Apache-2.0

/*
 * gpu_ranks: cross-rail writes of GPU memory through libpxn's C ABI alone,
 * on a CUDA machine. The parent starts four processes of this program:
 * two targets (rail 0 and rail 1; each holds a device buffer exported with
 * CUDA IPC, as a remote node's registered memory) and two ranks (HCA mlx5_r
 * on rail r). Rank r writes to the target on the other rail, so each rank's
 * writes are relayed by the other rank. The host transport of each rank is
 * an emulated NIC written here: a copy-engine copy into the target's
 * IPC-mapped buffer, completed no sooner than a wire of --rate GB/s would
 * have carried it. Every case runs twice: once with the source made ready
 * on a stream the engine must wait for, once timed; after each pass the
 * target checks every byte of its buffer.
 *
 * With --pidns 1 each rank starts as the first process of a PID and mount
 * namespace of its own, with its own /proc: two ranks in two pods without
 * hostPID (needs root). The targets stay in the parent's namespace.
 *
 * It declares the few driver entry points it calls and loads libcuda.so.1
 * with dlopen: no CUDA header or library is needed to build it.
 *
 * Prints one "CASE ..." line per case and "PASS", exits 0; or names what
 * failed and exits 1. Exits 3 when there is no CUDA driver or device.
 */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pxn.h"

/* ---- the driver API, declared by hand ---- */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef struct {
	char reserved[64];
} CUipcMemHandle;
typedef struct {
	int type;
	int id;
} CUmemLocation;
typedef struct {
	int srcAccessOrder;
	CUmemLocation srcLocHint;
	CUmemLocation dstLocHint;
	unsigned int flags;
} CUmemcpyAttributes;
typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;
typedef struct {
	CUmemLocation location;
	int flags;
} CUmemAccessDesc;
typedef unsigned long long CUmemGenericAllocationHandle;

#define CU_STREAM_NON_BLOCKING 1
#define CU_EVENT_DISABLE_TIMING 2
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1
#define CU_MEMCPY_SRC_ACCESS_ORDER_STREAM 1
#define CU_ERROR_NOT_READY 600
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
/* The ranges the engine registers its arena as: one a lane. */
#define ARENA_RANGES 7

static struct {
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*MemsetD32)(CUdeviceptr, unsigned, size_t);
	CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*MemcpyBatchAsync)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *,
				     size_t, CUstream);
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
	CUresult (*StreamCreate)(CUstream *, unsigned);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*EventCreate)(CUevent *, unsigned);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventQuery)(CUevent);
	CUresult (*CtxSynchronize)(void);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
	CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
} cu;

typedef CUresult (*getproc_fn)(const char *, void **, int, unsigned long long, int *);

static int role_index = -1;
static const char *role_name = "parent";

#define FAILF(...)                                                                       \
	do {                                                                             \
		fprintf(stderr, "FAIL %s %d: ", role_name, role_index);                  \
		fprintf(stderr, __VA_ARGS__);                                            \
		fprintf(stderr, "\n");                                                   \
		fail_all();                                                              \
		exit(1);                                                                 \
	} while (0)

#define CU(call)                                                                         \
	do {                                                                             \
		CUresult r_ = (call);                                                    \
		if (r_ != 0)                                                             \
			FAILF("%s: CUresult %d", #call, r_);                             \
	} while (0)

static void fail_all(void);

/* Returns 0, or -1 when there is no usable driver. */
static int load_cuda(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL)
		return -1;
	getproc_fn getproc = (getproc_fn)dlsym(lib, "cuGetProcAddress_v2");
	cu.Init = (CUresult(*)(unsigned))dlsym(lib, "cuInit");
	if (getproc == NULL || cu.Init == NULL || cu.Init(0) != 0)
		return -1;
#define GET(field, name, version)                                                        \
	do {                                                                             \
		void *fp_ = NULL;                                                        \
		int st_ = 0;                                                             \
		if (getproc(name, &fp_, version, 1, &st_) == 0 && st_ == 0)              \
			memcpy(&cu.field, &fp_, sizeof(fp_));                            \
	} while (0)
	GET(DeviceGetCount, "cuDeviceGetCount", 2000);
	GET(DeviceGet, "cuDeviceGet", 2000);
	GET(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000);
	GET(CtxSetCurrent, "cuCtxSetCurrent", 4000);
	GET(MemAlloc, "cuMemAlloc", 3020);
	GET(MemcpyHtoD, "cuMemcpyHtoD", 3020);
	GET(MemcpyDtoH, "cuMemcpyDtoH", 3020);
	GET(MemsetD32, "cuMemsetD32", 3020);
	GET(MemcpyAsync, "cuMemcpyAsync", 4000);
	GET(MemcpyBatchAsync, "cuMemcpyBatchAsync", 13000);
	GET(IpcGetMemHandle, "cuIpcGetMemHandle", 4010);
	GET(IpcOpenMemHandle, "cuIpcOpenMemHandle", 11000);
	GET(StreamCreate, "cuStreamCreate", 2000);
	GET(StreamSynchronize, "cuStreamSynchronize", 2000);
	GET(EventCreate, "cuEventCreate", 2000);
	GET(EventRecord, "cuEventRecord", 2000);
	GET(EventQuery, "cuEventQuery", 2000);
	GET(CtxSynchronize, "cuCtxSynchronize", 2000);
	GET(MemCreate, "cuMemCreate", 10020);
	GET(MemAddressReserve, "cuMemAddressReserve", 10020);
	GET(MemMap, "cuMemMap", 10020);
	GET(MemSetAccess, "cuMemSetAccess", 10020);
	GET(MemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020);
#undef GET
	int n = 0;
	if (cu.DeviceGetCount == NULL || cu.DeviceGetCount(&n) != 0 || n == 0)
		return -1;
	return n;
}

/* ---- what the processes share ---- */

#define NRANKS 2
#define NPROCS (2 * NRANKS)
#define MAX_CASES 8
#define MAX_REPS 64
#define TARGET_BASE(k) (UINT64_C(0x7e0000000000) + (uint64_t)(k) * (UINT64_C(1) << 40))
#define BLOCK_GAP 2
#define GUARD (UINT64_C(64) << 10)

typedef struct rank_result {
	double start_ms, end_ms;
	uint64_t bytes;
	uint64_t tasks;
	uint64_t failed;
	uint64_t midway_transferred;
	int saw_waiting;
	char first_error[256];
} rank_result;

typedef struct shared {
	_Atomic int failed;
	_Atomic unsigned arrived;
	_Atomic unsigned generation;
	CUipcMemHandle handle[NRANKS];
	uint64_t target_len;
	int reps;
	rank_result result[MAX_CASES][2][NRANKS];
	/* Each timed repetition's start and end, per rank. */
	double rep_start[MAX_CASES][MAX_REPS][NRANKS], rep_end[MAX_CASES][MAX_REPS][NRANKS];
	int verified[MAX_CASES][2][NRANKS];
	char verify_error[MAX_CASES][2][NRANKS][256];
	pxn_counters counters[NRANKS];
	uint64_t relayed_ops[NRANKS], routed_ops[NRANKS], bad_ops[NRANKS];
	uint64_t vmm_relayed[NRANKS];
	int copier_chosen[NRANKS];
} shared;

static shared *shm;

static void fail_all(void)
{
	if (shm != NULL)
		atomic_store(&shm->failed, 1);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A barrier of every child, with a deadline; a failed child ends it for all. */
static void barrier(const char *where)
{
	unsigned gen = atomic_load(&shm->generation);
	if (atomic_fetch_add(&shm->arrived, 1) + 1 == NPROCS) {
		atomic_store(&shm->arrived, 0);
		atomic_fetch_add(&shm->generation, 1);
		return;
	}
	double begin = now_ms(), deadline = begin + 300000;
	struct timespec pause = {0, 20000};
	while (atomic_load(&shm->generation) == gen) {
		/* Spin at first: timed repetitions start together. */
		if (now_ms() - begin < 5)
			continue;
		if (atomic_load(&shm->failed)) {
			fprintf(stderr, "%s %d: another process failed (at %s)\n", role_name, role_index, where);
			exit(1);
		}
		if (now_ms() > deadline)
			FAILF("barrier %s: the others did not come within 300 s", where);
		nanosleep(&pause, NULL);
	}
}

/* ---- cases ---- */

typedef struct test_case {
	const char *name;
	uint64_t len;
	/* blocks > 1: that many blocks of len / blocks, scattered. */
	uint64_t blocks;
	/* from_vmm: the source is a cuMemCreate mapping. */
	int from_vmm;
} test_case;

static const test_case cases[] = {
	{"10KiB", 10 << 10, 1, 0},
	{"8MiB-1", (8 << 20) - 1, 1, 0},
	{"8MiB+1", (8 << 20) + 1, 1, 0},
	{"1GiB", UINT64_C(1) << 30, 1, 0},
	{"4096x16KiB-scattered", UINT64_C(4096) * (16 << 10), 4096, 0},
	{"8MiB+1-from-cuMemCreate", (8 << 20) + 1, 1, 1},
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

/* Block i's place among blocks slots, a fixed permutation (odd multiplier mod a power of two). */
static uint64_t scatter(uint64_t i, uint64_t blocks, uint64_t salt)
{
	return (i * (2 * salt + 0x9E37) + salt) & (blocks * BLOCK_GAP - 1);
}

/* Block i of case c: where it comes from in the source and lands in the target. */
static void block_of(const test_case *c, uint64_t i, uint64_t *src, uint64_t *dst, uint64_t *len)
{
	if (c->blocks <= 1) {
		*src = 0;
		*dst = 0;
		*len = c->len;
		return;
	}
	uint64_t b = c->len / c->blocks;
	*len = b;
	*src = scatter(i, c->blocks, 3) * b;
	*dst = scatter(i, c->blocks, 11) * b;
}

static uint64_t case_span(const test_case *c)
{
	return c->blocks <= 1 ? c->len : c->len * BLOCK_GAP;
}

/* The byte at source offset off of rank r. */
static inline uint64_t pattern_word(int r, uint64_t w)
{
	uint64_t z = (uint64_t)(r + 1) * UINT64_C(0x9E3779B97F4A7C15) + w * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 31)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 29);
}

static inline uint8_t pattern(int r, uint64_t off)
{
	return (uint8_t)(pattern_word(r, off / 8) >> (8 * (off % 8)));
}

static void fill_pattern(uint8_t *b, int r, uint64_t off, uint64_t n)
{
	uint64_t i = 0;
	for (; i < n && (off + i) % 8 != 0; i++)
		b[i] = pattern(r, off + i);
	for (; i + 8 <= n; i += 8) {
		uint64_t w = pattern_word(r, (off + i) / 8);
		memcpy(b + i, &w, 8);
	}
	for (; i < n; i++)
		b[i] = pattern(r, off + i);
}

/* ---- target ---- */

static void run_target(int k, int ordinal)
{
	CUdevice dev;
	CUcontext ctx;
	CU(cu.DeviceGet(&dev, ordinal));
	CU(cu.PrimaryCtxRetain(&ctx, dev));
	CU(cu.CtxSetCurrent(ctx));
	uint64_t len = shm->target_len;
	CUdeviceptr buf;
	CU(cu.MemAlloc(&buf, len + 4096));
	CU(cu.IpcGetMemHandle(&shm->handle[k], buf));
	barrier("targets published");
	barrier("ranks open");
	uint8_t *host = malloc(len);
	if (host == NULL)
		FAILF("malloc %llu", (unsigned long long)len);
	/* The rank whose writes land here. */
	int from = (k + NRANKS - 1) % NRANKS;
	for (size_t c = 0; c < NCASES; c++) {
		const test_case *tc = &cases[c];
		uint64_t span = case_span(tc) + GUARD;
		for (int pass = 0; pass < 2; pass++) {
			CU(cu.MemsetD32(buf, 0, span / 4 + 1));
			CU(cu.CtxSynchronize());
			barrier("cleared");
			for (int rep = 0; pass == 1 && rep < shm->reps; rep++)
				barrier("repetition");
			barrier("written");
			CU(cu.MemcpyDtoH(host, buf, span));
			char *why = shm->verify_error[c][pass][k];
			int ok = 1;
			/* Every byte: the written blocks carry the pattern, the rest stays zero. */
			uint8_t *want = calloc(1, span);
			if (want == NULL)
				FAILF("calloc");
			for (uint64_t i = 0; i < (tc->blocks <= 1 ? 1 : tc->blocks); i++) {
				uint64_t s, d, n;
				block_of(tc, i, &s, &d, &n);
				fill_pattern(want + d, from, s, n);
			}
			for (uint64_t i = 0; i < span && ok; i++) {
				if (host[i] != want[i]) {
					snprintf(why, 256, "%s pass %d: byte %llu is 0x%02x, want 0x%02x", tc->name, pass,
						 (unsigned long long)i, host[i], want[i]);
					ok = 0;
				}
			}
			free(want);
			shm->verified[c][pass][k] = ok;
			barrier("verified");
		}
	}
	free(host);
	barrier("counters");
	barrier("closed");
}

/* ---- rank: the emulated NIC ---- */

#define NIC_DEPTH 65536
#define NIC_EVENTS 1024

typedef struct nic_op {
	uint64_t token;
	int64_t finish_ns;
	int event;
	int status;
} nic_op;

typedef struct nic {
	int rank;
	double rate;
	CUstream stream;
	CUevent events[NIC_EVENTS];
	int ev_done[NIC_EVENTS];
	int ev_ops[NIC_EVENTS];
	int ev_head, ev_n;
	nic_op ops[NIC_DEPTH];
	size_t head, n;
	int64_t wire_ns;
	CUdeviceptr mapped[NRANKS];
	uint64_t target_len;
	/* The engine registers its arena one lane at a time: a range each. */
	struct {
		uint8_t *addr;
		uint64_t len, key;
	} arena[ARENA_RANGES];
	int arena_ranges;
	uint64_t arena_keys;
	int arena_kind;
	uint64_t relayed_ops, routed_ops, bad_ops;
	CUdeviceptr dsts[4096], srcs[4096];
	size_t sizes[4096];
} nic;

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int target_index(const char *session)
{
	if (strncmp(session, "tgt", 3) != 0 || session[3] < '0' || session[3] >= '0' + NRANKS || session[4] != 0)
		return -1;
	return session[3] - '0';
}

static pthread_mutex_t nic_mu = PTHREAD_MUTEX_INITIALIZER;

static void nic_flush(nic *n, size_t k)
{
	if (k == 0)
		return;
	if (cu.MemcpyBatchAsync != NULL) {
		CUmemcpyAttributes attr;
		memset(&attr, 0, sizeof(attr));
		attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
		size_t idx = 0;
		CU(cu.MemcpyBatchAsync(n->dsts, n->srcs, n->sizes, k, &attr, &idx, 1, n->stream));
		return;
	}
	for (size_t i = 0; i < k; i++)
		CU(cu.MemcpyAsync(n->dsts[i], n->srcs[i], n->sizes[i], n->stream));
}

static int nic_submit(void *user, const pxn_transport_op *ops, size_t count)
{
	nic *n = user;
	pthread_mutex_lock(&nic_mu);
	if (n->n + count > NIC_DEPTH || n->ev_n == NIC_EVENTS || count > 4096) {
		pthread_mutex_unlock(&nic_mu);
		return PXN_BUSY;
	}
	int ev = (n->ev_head + n->ev_n) % NIC_EVENTS;
	int64_t now = now_ns();
	size_t k = 0;
	for (size_t i = 0; i < count; i++) {
		const pxn_transport_op *op = &ops[i];
		nic_op *o = &n->ops[(n->head + n->n + i) % NIC_DEPTH];
		o->token = op->token;
		o->status = PXN_OK;
		o->event = -1;
		o->finish_ns = 0;
		int t = target_index(op->target);
		if (op->flags & PXN_OP_RELAYED) {
			n->relayed_ops++;
			const uint8_t *s = op->src;
			int in = 0;
			for (int a = 0; a < ARENA_RANGES && !in; a++)
				in = n->arena[a].addr != NULL && s >= n->arena[a].addr &&
				     (uint64_t)(s - n->arena[a].addr) + op->len <= n->arena[a].len &&
				     (op->flags & PXN_OP_LOCAL_KEY) && op->local_key == n->arena[a].key;
			if (!in)
				n->bad_ops++;
		}
		if (op->flags & PXN_OP_ROUTED) {
			n->routed_ops++;
			if (op->route != (uint64_t)(t + 1) || op->remote_key != UINT64_C(0xbeef00) + (uint64_t)t) {
				o->status = PXN_ESTALE;
				n->bad_ops++;
			}
		}
		if (op->read || t < 0 || op->dst < TARGET_BASE(t) || op->dst - TARGET_BASE(t) + op->len > n->target_len)
			o->status = PXN_EINVAL;
		if (o->status != PXN_OK)
			continue;
		int64_t start = now > n->wire_ns ? now : n->wire_ns;
		n->wire_ns = start + (n->rate > 0 ? (int64_t)((double)op->len / n->rate) : 0);
		o->finish_ns = n->wire_ns;
		if (op->len == 0)
			continue;
		n->dsts[k] = n->mapped[t] + (op->dst - TARGET_BASE(t));
		n->srcs[k] = (CUdeviceptr)(uintptr_t)op->src;
		n->sizes[k] = op->len;
		k++;
		o->event = ev;
	}
	nic_flush(n, k);
	if (k > 0) {
		CU(cu.EventRecord(n->events[ev], n->stream));
		n->ev_done[ev] = 0;
		n->ev_ops[ev] = (int)k;
		n->ev_n++;
	}
	n->n += count;
	pthread_mutex_unlock(&nic_mu);
	return PXN_OK;
}

static size_t nic_poll(void *user, pxn_transport_completion *out, size_t capacity)
{
	nic *n = user;
	pthread_mutex_lock(&nic_mu);
	int64_t now = now_ns();
	size_t got = 0;
	while (got < capacity && n->n > 0) {
		nic_op *o = &n->ops[n->head];
		if (o->event >= 0 && !n->ev_done[o->event]) {
			CUresult r = cu.EventQuery(n->events[o->event]);
			if (r == CU_ERROR_NOT_READY)
				break;
			if (r != 0)
				FAILF("cuEventQuery: %d", r);
			n->ev_done[o->event] = 1;
		}
		if (o->finish_ns > now)
			break;
		out[got].token = o->token;
		out[got].status = o->status;
		out[got].reserved = 0;
		snprintf(out[got].message, PXN_MESSAGE_MAX, "%s", o->status == PXN_OK ? "" : "refused by the emulated NIC");
		got++;
		if (o->event >= 0 && --n->ev_ops[o->event] == 0) {
			n->ev_head = (n->ev_head + 1) % NIC_EVENTS;
			n->ev_n--;
		}
		n->head = (n->head + 1) % NIC_DEPTH;
		n->n--;
	}
	pthread_mutex_unlock(&nic_mu);
	return got;
}

static int resolve(void *user, const char *session, uint64_t dst, pxn_target_info *out)
{
	const nic *n = user;
	int t = target_index(session);
	if (t < 0 || dst < TARGET_BASE(t) || dst - TARGET_BASE(t) >= n->target_len)
		return PXN_EINVAL;
	out->hca_count = 1;
	snprintf(out->hca, sizeof(out->hca), "rmlx5_%d", t);
	out->range_base = TARGET_BASE(t);
	out->range_len = n->target_len;
	out->route = (uint64_t)t + 1;
	out->remote_key = UINT64_C(0xbeef00) + (uint64_t)t;
	return PXN_OK;
}

static int register_arena(void *user, void *addr, uint64_t len, int kind, uint64_t *key)
{
	nic *n = user;
	for (int a = 0; a < ARENA_RANGES; a++) {
		if (n->arena[a].addr != NULL)
			continue;
		n->arena[a].addr = addr;
		n->arena[a].len = len;
		n->arena[a].key = UINT64_C(0x1eaf0000) + ((uint64_t)n->rank << 12) + ++n->arena_keys;
		n->arena_kind = kind;
		n->arena_ranges++;
		*key = n->arena[a].key;
		return PXN_OK;
	}
	return PXN_EIO;
}

static int deregister_arena(void *user, void *addr, uint64_t len, uint64_t key)
{
	nic *n = user;
	for (int a = 0; a < ARENA_RANGES; a++) {
		if (n->arena[a].addr == addr && n->arena[a].len == len && n->arena[a].key == key) {
			n->arena[a].addr = NULL;
			n->arena_ranges--;
			return PXN_OK;
		}
	}
	return PXN_EINVAL;
}

static void die_pxn(const char *what, int rc)
{
	char msg[PXN_ERROR_MAX];
	pxn_last_error(msg, sizeof(msg));
	FAILF("%s: %s (%d): %s", what, pxn_strerror(rc), rc, msg);
}

/* Allocates n bytes with cuMemCreate, mapped read-write on dev. */
static CUdeviceptr vmm_alloc(CUdevice dev, uint64_t *n)
{
	if (cu.MemCreate == NULL || cu.MemAddressReserve == NULL || cu.MemMap == NULL || cu.MemSetAccess == NULL ||
	    cu.MemGetAllocationGranularity == NULL)
		FAILF("the driver lacks the cuMemCreate family");
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	size_t gran = 0;
	CU(cu.MemGetAllocationGranularity(&gran, &prop, 0));
	*n = (*n + gran - 1) / gran * gran;
	CUmemGenericAllocationHandle h;
	CU(cu.MemCreate(&h, *n, &prop, 0));
	CUdeviceptr p;
	CU(cu.MemAddressReserve(&p, *n, 0, 0, 0));
	CU(cu.MemMap(p, *n, 0, h, 0));
	CUmemAccessDesc acc = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, dev}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CU(cu.MemSetAccess(p, *n, &acc, 1));
	return p;
}

static void fill_device(CUdeviceptr p, int r, uint64_t n)
{
	const uint64_t chunk = 64 << 20;
	uint8_t *b = malloc(chunk);
	if (b == NULL)
		FAILF("malloc");
	for (uint64_t off = 0; off < n; off += chunk) {
		uint64_t k = n - off < chunk ? n - off : chunk;
		fill_pattern(b, r, off, k);
		CU(cu.MemcpyHtoD(p + off, b, k));
	}
	free(b);
}

#define SUBMIT_BATCH 16

/*
 * Writes case c once: pass 0 makes the source ready on stream s right before
 * the submit (the engine must wait for it), pass 1 is timed with the source
 * ready. Requests go in batches of SUBMIT_BATCH, all submitted before any is
 * waited for; every task must complete in full.
 */
static void write_case(pxn_engine_t e, int r, size_t c, int pass, CUdeviceptr src, CUdeviceptr pristine,
		       CUstream s, rank_result *res)
{
	const test_case *tc = &cases[c];
	int t = (r + 1) % NRANKS;
	char session[8];
	snprintf(session, sizeof(session), "tgt%d", t);
	uint64_t nblocks = tc->blocks <= 1 ? 1 : tc->blocks;
	pxn_request *reqs = calloc(nblocks, sizeof(*reqs));
	pxn_batch_t *batches = calloc(nblocks / SUBMIT_BATCH + 1, sizeof(*batches));
	if (reqs == NULL || batches == NULL)
		FAILF("calloc");
	for (uint64_t i = 0; i < nblocks; i++) {
		uint64_t so, d, n;
		block_of(tc, i, &so, &d, &n);
		reqs[i] = (pxn_request){.op = PXN_OP_WRITE, .src = (void *)(uintptr_t)(src + so), .len = n,
					.target = session, .dst = TARGET_BASE(t) + d, .stream = s};
	}
	if (pass == 0) {
		/* Wipe the source, then restore it on s: only s says when it is ready. */
		uint64_t span = case_span(tc);
		CU(cu.MemsetD32(src, 0, span / 4 + 1));
		CU(cu.CtxSynchronize());
		CU(cu.MemcpyAsync(src, pristine, span, s));
	}
	size_t nb = 0;
	res->start_ms = now_ms();
	for (uint64_t i = 0; i < nblocks; i += SUBMIT_BATCH) {
		size_t k = nblocks - i < SUBMIT_BATCH ? nblocks - i : SUBMIT_BATCH;
		int rc = pxn_submit(e, reqs + i, k, &batches[nb++]);
		if (rc != PXN_OK)
			die_pxn("pxn_submit", rc);
	}
	double deadline = now_ms() + 120000;
	for (size_t b = 0; b < nb; b++) {
		size_t k = nblocks - b * SUBMIT_BATCH < SUBMIT_BATCH ? nblocks - b * SUBMIT_BATCH : SUBMIT_BATCH;
		for (size_t i = 0; i < k; i++) {
			pxn_task_status st;
			for (;;) {
				int rc = pxn_get_status(e, batches[b], i, &st);
				if (rc != PXN_OK)
					die_pxn("pxn_get_status", rc);
				if (st.state != PXN_TASK_WAITING)
					break;
				res->saw_waiting = 1;
				if (st.transferred > 0 && st.transferred < reqs[b * SUBMIT_BATCH + i].len)
					res->midway_transferred = st.transferred;
				if (now_ms() > deadline)
					FAILF("%s: task %zu of batch %zu still WAITING after 120 s", tc->name, i, b);
			}
			if (st.state != PXN_TASK_COMPLETED || st.transferred != reqs[b * SUBMIT_BATCH + i].len) {
				res->failed++;
				if (res->first_error[0] == 0) {
					char msg[PXN_ERROR_MAX];
					pxn_last_error(msg, sizeof(msg));
					snprintf(res->first_error, sizeof(res->first_error), "state %d, %llu bytes: %.200s",
						 st.state, (unsigned long long)st.transferred, msg);
				}
			}
		}
	}
	res->end_ms = now_ms();
	for (size_t b = 0; b < nb; b++) {
		int rc = pxn_free_batch(e, batches[b]);
		if (rc != PXN_OK)
			die_pxn("pxn_free_batch", rc);
	}
	res->bytes = tc->len;
	res->tasks = nblocks;
	free(batches);
	free(reqs);
}

static void run_rank(int r, int ordinal, double rate)
{
	CUdevice dev;
	CUcontext ctx;
	char ns[64] = "?";
	ssize_t nl = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
	ns[nl > 0 ? nl : 1] = 0;
	printf("RANKNS %d pid=%d pidns=%s\n", r, (int)getpid(), ns);
	CU(cu.DeviceGet(&dev, ordinal));
	CU(cu.PrimaryCtxRetain(&ctx, dev));
	CU(cu.CtxSetCurrent(ctx));
	uint64_t span = 0;
	for (size_t c = 0; c < NCASES; c++)
		if (case_span(&cases[c]) > span)
			span = case_span(&cases[c]);
	CUdeviceptr src, pristine;
	CU(cu.MemAlloc(&src, span + 4096));
	CU(cu.MemAlloc(&pristine, span + 4096));
	fill_device(pristine, r, span);
	CU(cu.MemcpyAsync(src, pristine, span, NULL));
	uint64_t vmm_len = UINT64_C(16) << 20;
	CUdeviceptr vmm = vmm_alloc(dev, &vmm_len);
	CUdeviceptr vmm_pristine;
	CU(cu.MemAlloc(&vmm_pristine, vmm_len));
	CU(cu.MemcpyAsync(vmm_pristine, pristine, vmm_len, NULL));
	CU(cu.CtxSynchronize());

	barrier("targets published");
	static nic n;
	n.rank = r;
	n.rate = rate;
	n.target_len = shm->target_len;
	CU(cu.StreamCreate(&n.stream, CU_STREAM_NON_BLOCKING));
	for (int i = 0; i < NIC_EVENTS; i++)
		CU(cu.EventCreate(&n.events[i], CU_EVENT_DISABLE_TIMING));
	for (int k = 0; k < NRANKS; k++)
		CU(cu.IpcOpenMemHandle(&n.mapped[k], shm->handle[k], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	CUstream s;
	CU(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));

	char hca[16], rail[16];
	snprintf(hca, sizeof(hca), "mlx5_%d", r);
	pxn_transport tr = {.struct_size = sizeof(tr), .user = &n, .submit = nic_submit, .poll = nic_poll};
	pxn_options o = {
		.struct_size = sizeof(o),
		.version = PXN_OPTIONS_VERSION,
		.local_hca = hca,
		.transport = &tr,
		.resolve = resolve,
		.resolve_user = &n,
		.copier = PXN_COPIER_DEFAULT,
		.register_arena = register_arena,
		.deregister_arena = deregister_arena,
		.arena_user = &n,
	};
	pxn_engine_t e;
	int rc = pxn_open(&o, &e);
	if (rc != PXN_OK)
		die_pxn("pxn_open", rc);
	pxn_counters cn = {.struct_size = sizeof(cn)};
	if ((rc = pxn_get_counters(e, &cn)) != PXN_OK)
		die_pxn("pxn_get_counters", rc);
	shm->copier_chosen[r] = (int)cn.copier;
	if (cn.copier != PXN_COPIER_CUDA || !cn.pxn_active)
		FAILF("PXN_COPIER_DEFAULT chose copier %llu, PXN active %u; want the CUDA copier, active",
		      (unsigned long long)cn.copier, cn.pxn_active);
	if (n.arena_ranges != ARENA_RANGES || n.arena_kind != PXN_MEM_DEVICE)
		FAILF("the arena was registered as %d ranges of kind %d, want one a lane (%d) of device memory", n.arena_ranges,
		      n.arena_kind, ARENA_RANGES);
	if ((rc = pxn_register_memory(e, (void *)(uintptr_t)src, span + 4096, PXN_MEM_DEVICE)) != PXN_OK)
		die_pxn("pxn_register_memory(cuMemAlloc)", rc);
	if ((rc = pxn_register_memory(e, (void *)(uintptr_t)vmm, vmm_len, PXN_MEM_DEVICE)) != PXN_OK)
		die_pxn("pxn_register_memory(cuMemCreate)", rc);
	static uint8_t host_bytes[4096];
	if ((rc = pxn_register_memory(e, host_bytes, sizeof(host_bytes), PXN_MEM_DEVICE)) != PXN_EINVAL)
		FAILF("pxn_register_memory(host memory as device) = %d, want PXN_EINVAL", rc);
	snprintf(rail, sizeof(rail), "rail%d", (r + 1) % NRANKS);
	if ((rc = pxn_wait_relay(e, rail, 60000)) != PXN_OK)
		die_pxn("pxn_wait_relay", rc);
	barrier("ranks open");

	for (size_t c = 0; c < NCASES; c++) {
		CUdeviceptr from = cases[c].from_vmm ? vmm : src;
		CUdeviceptr from_pristine = cases[c].from_vmm ? vmm_pristine : pristine;
		for (int pass = 0; pass < 2; pass++) {
			barrier("cleared");
			pxn_counters before = {.struct_size = sizeof(before)};
			pxn_get_counters(e, &before);
			if (pass == 0) {
				write_case(e, r, c, pass, from, from_pristine, s, &shm->result[c][pass][r]);
			}
			/*
			 * The timed pass is repeated, each repetition started by
			 * both ranks at once; the last one's bytes are checked.
			 */
			for (int rep = 0; pass == 1 && rep < shm->reps; rep++) {
				barrier("repetition");
				rank_result *res = &shm->result[c][pass][r];
				memset(res, 0, sizeof(*res));
				write_case(e, r, c, pass, from, from_pristine, s, res);
				shm->rep_start[c][rep][r] = res->start_ms;
				shm->rep_end[c][rep][r] = res->end_ms;
				if (res->failed > 0)
					break;
			}
			if (cases[c].from_vmm) {
				pxn_counters after = {.struct_size = sizeof(after)};
				pxn_get_counters(e, &after);
				shm->vmm_relayed[r] += after.relayed_bytes - before.relayed_bytes;
			}
			barrier("written");
			barrier("verified");
		}
	}
	cn.struct_size = sizeof(cn);
	if ((rc = pxn_get_counters(e, &cn)) != PXN_OK)
		die_pxn("pxn_get_counters", rc);
	barrier("counters");
	/* Forwarded counts are final once every rank is done. */
	cn.struct_size = sizeof(cn);
	pxn_get_counters(e, &cn);
	shm->counters[r] = cn;
	pthread_mutex_lock(&nic_mu);
	shm->relayed_ops[r] = n.relayed_ops;
	shm->routed_ops[r] = n.routed_ops;
	shm->bad_ops[r] = n.bad_ops;
	pthread_mutex_unlock(&nic_mu);
	if ((rc = pxn_close(e, 30000)) != PXN_OK)
		die_pxn("pxn_close", rc);
	if (n.arena_ranges != 0)
		FAILF("pxn_close left %d ranges of the arena registered", n.arena_ranges);
	barrier("closed");
}

/* ---- parent ---- */

/*
 * In the child of spawn: the rest runs as the first process of new PID and
 * mount namespaces, with a /proc of its own; this process waits for it and
 * exits as it did.
 */
static void enter_namespaces(void)
{
	if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) {
		fprintf(stderr, "FAIL: unshare(CLONE_NEWPID|CLONE_NEWNS): %s (needs root)\n", strerror(errno));
		_exit(126);
	}
	pid_t pid = fork();
	if (pid < 0)
		_exit(126);
	if (pid > 0) {
		int st = 0;
		if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st))
			_exit(125);
		_exit(WEXITSTATUS(st));
	}
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
	    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) {
		fprintf(stderr, "FAIL: mount /proc in the new namespace: %s\n", strerror(errno));
		_exit(126);
	}
}

static int spawn(const char *self, int fd, const char *role, int index, int gpu, const char *rate, int pidns)
{
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		if (pidns)
			enter_namespaces();
		char fds[16], idx[16], g[16];
		snprintf(fds, sizeof(fds), "%d", fd);
		snprintf(idx, sizeof(idx), "%d", index);
		snprintf(g, sizeof(g), "%d", gpu);
		execl(self, self, "--role", role, "--index", idx, "--gpu", g, "--shm-fd", fds, "--rate", rate,
		      (char *)NULL);
		_exit(127);
	}
	return pid;
}

/*
 * Whether n bytes are a whole number of one request's Pieces: 8 MiB slots,
 * or, when the request found its lane idle, the engine's ramp: the first
 * at most MC_PXN_FIRST_PIECE_KIB (256 KiB when unset), each next at most
 * twice the one before, up to the slot.
 */
static int whole_pieces(uint64_t n)
{
	const uint64_t slot = UINT64_C(8) << 20;
	const char *env = getenv("MC_PXN_FIRST_PIECE_KIB");
	uint64_t cap = (env != NULL && *env != '\0' ? strtoull(env, NULL, 10) : 256) << 10, sum = 0;
	if (n % slot == 0)
		return 1;
	if (cap == 0 || cap > slot)
		cap = slot;
	while (sum < n) {
		sum += cap;
		cap = cap < slot / 2 ? 2 * cap : slot;
	}
	return sum == n;
}

int main(int argc, char **argv)
{
	const char *role = "parent", *rate = "50";
	int index = 0, gpu = -1, fd = -1, reps = 1, pidns = 0;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--role") == 0)
			role = argv[i + 1];
		else if (strcmp(argv[i], "--index") == 0)
			index = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--gpu") == 0)
			gpu = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--shm-fd") == 0)
			fd = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--rate") == 0)
			rate = argv[i + 1];
		else if (strcmp(argv[i], "--reps") == 0)
			reps = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--pidns") == 0)
			pidns = atoi(argv[i + 1]);
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (strcmp(role, "parent") != 0) {
		role_name = role;
		role_index = index;
		shm = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (shm == MAP_FAILED)
			return 1;
		if (load_cuda() < 0)
			FAILF("no CUDA driver in the child");
		if (strcmp(role, "target") == 0)
			run_target(index, gpu);
		else
			run_rank(index, gpu, atof(rate));
		return 0;
	}

	int ndev = load_cuda();
	if (ndev <= 0) {
		printf("SKIP: no CUDA driver (libcuda.so.1) or no device\n");
		return 3;
	}
	fd = memfd_create("gpu_ranks", 0);
	if (fd < 0 || ftruncate(fd, sizeof(shared)) != 0)
		FAILF("memfd: %s", strerror(errno));
	shm = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (shm == MAP_FAILED)
		FAILF("mmap");
	uint64_t span = 0;
	for (size_t c = 0; c < NCASES; c++)
		if (case_span(&cases[c]) > span)
			span = case_span(&cases[c]);
	shm->target_len = (span + GUARD + 4095) & ~UINT64_C(4095);
	if (reps < 1 || reps > MAX_REPS)
		FAILF("--reps %d: want 1..%d", reps, MAX_REPS);
	shm->reps = reps;
	printf("gpu_ranks: %d GPU(s); ranks and targets on GPU r %% %d; emulated NIC capped at %s GB/s; %s%s\n", ndev, ndev,
	       rate, ndev == 1 ? "one GPU: both ranks and both targets share GPU 0" : "",
	       pidns ? "; each rank in a PID and mount namespace of its own" : "");
	char self[4096];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (sl <= 0)
		FAILF("readlink /proc/self/exe");
	self[sl] = 0;
	pid_t pids[NPROCS];
	for (int k = 0; k < NRANKS; k++) {
		pids[k] = spawn(self, fd, "target", k, k % ndev, rate, 0);
		pids[NRANKS + k] = spawn(self, fd, "rank", k, k % ndev, rate, pidns);
	}
	int ok = 1;
	for (int i = 0; i < NPROCS; i++) {
		int st = 0;
		if (pids[i] < 0 || waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "FAIL: process %d exited with status 0x%x\n", i, st);
			ok = 0;
		}
	}
	if (!ok)
		return 1;
	for (size_t c = 0; c < NCASES; c++) {
		for (int pass = 0; pass < 2; pass++) {
			double first = 0, last = 0;
			uint64_t bytes = 0, failed = 0, midway = 0;
			int waiting = 0;
			for (int r = 0; r < NRANKS; r++) {
				const rank_result *x = &shm->result[c][pass][r];
				if (first == 0 || x->start_ms < first)
					first = x->start_ms;
				if (x->end_ms > last)
					last = x->end_ms;
				bytes += x->bytes;
				failed += x->failed;
				midway = x->midway_transferred > midway ? x->midway_transferred : midway;
				waiting |= x->saw_waiting;
				if (x->failed > 0) {
					fprintf(stderr, "FAIL: %s pass %d rank %d: %llu tasks failed: %s\n", cases[c].name, pass,
						r, (unsigned long long)x->failed, x->first_error);
					ok = 0;
				}
				if (!shm->verified[c][pass][(r + 1) % NRANKS]) {
					fprintf(stderr, "FAIL: target %d: %s\n", (r + 1) % NRANKS,
						shm->verify_error[c][pass][(r + 1) % NRANKS]);
					ok = 0;
				}
			}
			/*
			 * Tasks are WAITING while they run, and a task of many Pieces
			 * shows its completed Pieces' bytes (whole Pieces) before it
			 * completes.
			 */
			if (!waiting) {
				fprintf(stderr, "FAIL: %s pass %d: no task was seen WAITING\n", cases[c].name, pass);
				ok = 0;
			}
			if (cases[c].len == UINT64_C(1) << 30 && (midway == 0 || !whole_pieces(midway))) {
				fprintf(stderr, "FAIL: %s pass %d: transferred seen at %llu before completion; want whole Pieces\n",
					cases[c].name, pass, (unsigned long long)midway);
				ok = 0;
			}
			double ms = last - first;
			if (pass == 1) {
				/* The median and the best repetition, each timed across both ranks. */
				double spans[MAX_REPS];
				for (int k = 0; k < reps; k++) {
					double a = shm->rep_start[c][k][0], b = shm->rep_end[c][k][0];
					for (int r = 1; r < NRANKS; r++) {
						a = shm->rep_start[c][k][r] < a ? shm->rep_start[c][k][r] : a;
						b = shm->rep_end[c][k][r] > b ? shm->rep_end[c][k][r] : b;
					}
					spans[k] = b - a;
				}
				for (int i = 1; i < reps; i++)
					for (int j = i; j > 0 && spans[j] < spans[j - 1]; j--) {
						double x = spans[j];
						spans[j] = spans[j - 1];
						spans[j - 1] = x;
					}
				ms = spans[reps / 2];
				printf("REPS name=%s reps=%d median_ms=%.4f median_gbps=%.2f best_ms=%.4f best_gbps=%.2f\n",
				       cases[c].name, reps, ms, (double)bytes / ms / 1e6, spans[0],
				       (double)bytes / spans[0] / 1e6);
			}
			printf("CASE name=%s pass=%s bytes=%llu tasks=%llu ms=%.3f gbps=%.2f failed=%llu verified=%d "
			       "saw_waiting=%d midway_transferred=%llu\n",
			       cases[c].name, pass == 0 ? "stream-ready" : "timed", (unsigned long long)bytes,
			       (unsigned long long)(shm->result[c][pass][0].tasks + shm->result[c][pass][1].tasks), ms,
			       ms > 0 ? (double)bytes / ms / 1e6 : 0.0, (unsigned long long)failed, ok,
			       waiting, (unsigned long long)midway);
		}
	}
	for (int r = 0; r < NRANKS; r++) {
		const pxn_counters *cn = &shm->counters[r];
		printf("RANK %d copier=%llu relayed_bytes=%llu relayed_pieces=%llu fallback_bytes=%llu forwarded_bytes=%llu "
		       "failed_pieces=%llu direct_bytes=%llu second_hop_ops=%llu routed_ops=%llu bad_ops=%llu "
		       "cuMemCreate_relayed_bytes=%llu live_batches=%llu\n",
		       r, (unsigned long long)cn->copier, (unsigned long long)cn->relayed_bytes,
		       (unsigned long long)cn->relayed_pieces, (unsigned long long)cn->fallback_bytes,
		       (unsigned long long)cn->forwarded_bytes, (unsigned long long)cn->failed_pieces,
		       (unsigned long long)cn->direct_bytes, (unsigned long long)shm->relayed_ops[r],
		       (unsigned long long)shm->routed_ops[r], (unsigned long long)shm->bad_ops[r],
		       (unsigned long long)shm->vmm_relayed[r], (unsigned long long)cn->live_batches);
		if (cn->relayed_bytes == 0 || cn->fallback_bytes != 0 || cn->failed_pieces != 0 || shm->bad_ops[r] != 0 ||
		    shm->relayed_ops[r] == 0 || shm->routed_ops[r] != shm->relayed_ops[r] || cn->live_batches != 0 ||
		    shm->vmm_relayed[r] == 0) {
			fprintf(stderr, "FAIL: rank %d counters\n", r);
			ok = 0;
		}
	}
	if (!ok)
		return 1;
	printf("PASS\n");
	return 0;
}
