// SPDX-License-Identifier: Apache-2.0

/*
 * A CUDA driver for TestShimOnFakeDriver, so that shim.c runs on machines
 * without a GPU (and under the sanitizers there): device memory is host
 * memory, every call has completed when it returns, and the kernels it runs
 * are the gather kernel's contract: pxn_gather(plan, prefix, u32 n, cuts,
 * u32 parts, arrived, words, seq, bell) and pxn_gather_inline(the same in
 * one parameter), each part copied and then signalled: every part but the
 * last in its word, the last in bell when it is not 0.
 * Entry points come from cuGetProcAddress_v2 by name and CUDA version, as
 * from a real driver. PXN_FAKECUDA_VERSION sets the driver version
 * (default 13000); PXN_FAKECUDA_INIT makes cuInit return that result.
 * PXN_FAKECUDA_NO_MEMOPS=1 makes cuStreamWriteValue64 fail, as on a
 * driver without stream memory operations.
 * PXN_FAKECUDA_VMM=1 hands out the virtual memory calls (cuMemCreate and
 * the rest, POSIX descriptors only), which a driver without them lacks:
 * an allocation is a memfd, a reservation PROT_NONE address space, and a
 * mapping the memfd mapped over it, with the real driver's refusals that
 * PXN relies on (a mapping starts at offset 0 of its allocation and never
 * runs past its end; sizes and addresses are whole granules; a mapping is
 * inaccessible until cuMemSetAccess; only this driver's exports import).
 * PXN_FAKECUDA_CALLS names a file of call counts, which cuInit maps
 * (shared) and fills with one record an entry point, in the order of the
 * entry table: the name it is handed out by (56 bytes, NUL-padded) and a
 * 64-bit count of the calls since, so that a test counts the driver calls
 * of a code path. Each cuInit with the variable set starts a new file.
 * pxn_fakecuda_stall(stream, 1), called by a test through dlsym, wedges a
 * stream as a kernel that never ends would: the work enqueued on it from
 * then on never runs, an event recorded on it never completes, a stream
 * that waits for such an event is wedged too, and cuStreamSynchronize or
 * cuEventSynchronize on any of them blocks. pxn_fakecuda_stall(stream, 0)
 * lets them all complete (the work they dropped stays undone), so that a
 * test that failed can end.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
	OK = 0,
	INVALID_VALUE = 1,
	OUT_OF_MEMORY = 2,
	INVALID_DEVICE = 101,
	INVALID_CONTEXT = 201,
	INVALID_HANDLE = 400,
	NOT_FOUND = 500,
	NOT_READY = 600,
	LAUNCH_FAILED = 719,
	NOT_SUPPORTED = 801,
};

#define NDEV 2
#define MAGIC_STREAM 0x5757u
#define MAGIC_EVENT 0xe7e7u
#define MAGIC_MODULE 0x3030u
#define MAGIC_FUNCTION 0xf0f0u

/* Streams, events, modules and functions are heap objects, checked on use. */
typedef struct {
	unsigned magic;
	char name[64];
	/* stall: the stall a stream or event belongs to, 0 for none. */
	int stall;
} object;

typedef struct block {
	uintptr_t base;
	size_t size;
	int device;
	/* vmm: a cuMemMap mapping, which cuMemFree does not free. */
	int vmm;
	struct block *next;
} block;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static block *blocks;
static int contexts[NDEV];
/*
 * Static TLS: at exit of a Go test binary built with -asan, gcc 12's
 * LeakSanitizer crashes walking a thread's dynamic TLS (a dlopened
 * library's default model).
 */
static __thread int *current __attribute__((tls_model("initial-exec")));

static void *new_object(unsigned magic, const char *name)
{
	object *o = calloc(1, sizeof(*o));
	if (o != NULL) {
		o->magic = magic;
		if (name != NULL)
			strncpy(o->name, name, sizeof(o->name) - 1);
	}
	return o;
}

static int is(const void *h, unsigned magic)
{
	return h != NULL && ((const object *)h)->magic == magic;
}

static CUresult free_object(void *h, unsigned magic)
{
	if (!is(h, magic))
		return INVALID_HANDLE;
	((object *)h)->magic = 0;
	free(h);
	return OK;
}

/* Call counts (PXN_FAKECUDA_CALLS): a record per entry of the table. */
typedef struct {
	char name[56];
	uint64_t count;
} call_record;

static call_record *call_counts;
static size_t ncall_counts;

static int entry_of(void *fn);

/*
 * count_call counts one call of fn into the mapped file, if any; slot
 * caches fn's index in the entry table (-2 until looked up).
 */
static void count_call(void *fn, int *slot)
{
	call_record *c = __atomic_load_n(&call_counts, __ATOMIC_ACQUIRE);
	if (c == NULL)
		return;
	int i = __atomic_load_n(slot, __ATOMIC_RELAXED);
	if (i == -2) {
		i = entry_of(fn);
		__atomic_store_n(slot, i, __ATOMIC_RELAXED);
	}
	if (i >= 0 && (size_t)i < __atomic_load_n(&ncall_counts, __ATOMIC_RELAXED))
		__atomic_add_fetch(&c[i].count, 1, __ATOMIC_RELAXED);
}

#define CALLED(fn)                              \
	do {                                    \
		static int slot_ = -2;          \
		count_call((void *)(fn), &slot_); \
	} while (0)

static int stream_ok(void *s)
{
	return s == NULL || s == (void *)0x1 || s == (void *)0x2 || is(s, MAGIC_STREAM);
}

/* Stalls (pxn_fakecuda_stall): stall_done[id] once stall id is let go. */
#define MAX_STALLS 64
static pthread_mutex_t stall_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stall_cv = PTHREAD_COND_INITIALIZER;
static int stall_done[MAX_STALLS + 1];
static int nstalls;

static int stall_object(void *h)
{
	return is(h, MAGIC_STREAM) || is(h, MAGIC_EVENT);
}

/* stalled returns the stall that h, a stream or an event, is held by, or 0. */
static int stalled(void *h)
{
	if (h == NULL || h == (void *)0x1 || h == (void *)0x2 || !stall_object(h))
		return 0;
	pthread_mutex_lock(&stall_mu);
	int id = ((object *)h)->stall;
	if (id != 0 && stall_done[id])
		id = 0;
	pthread_mutex_unlock(&stall_mu);
	return id;
}

static void join_stall(void *h, int id)
{
	pthread_mutex_lock(&stall_mu);
	((object *)h)->stall = id;
	pthread_mutex_unlock(&stall_mu);
}

static void wait_stall(void *h)
{
	if (h == NULL || h == (void *)0x1 || h == (void *)0x2 || !stall_object(h))
		return;
	pthread_mutex_lock(&stall_mu);
	object *o = h;
	while (o->stall != 0 && !stall_done[o->stall])
		pthread_cond_wait(&stall_cv, &stall_mu);
	pthread_mutex_unlock(&stall_mu);
}

/* pxn_fakecuda_stall wedges stream s (on 1) or lets its stall go (on 0). */
int pxn_fakecuda_stall(void *s, int on)
{
	if (!is(s, MAGIC_STREAM))
		return INVALID_HANDLE;
	pthread_mutex_lock(&stall_mu);
	object *o = s;
	CUresult r = OK;
	if (on) {
		if (nstalls == MAX_STALLS)
			r = OUT_OF_MEMORY;
		else
			o->stall = ++nstalls;
	} else if (o->stall != 0) {
		stall_done[o->stall] = 1;
		pthread_cond_broadcast(&stall_cv);
	}
	pthread_mutex_unlock(&stall_mu);
	return r;
}

/* The allocation holding [p, p+n), or NULL; called with mu held. */
static block *find(uintptr_t p, size_t n)
{
	for (block *b = blocks; b != NULL; b = b->next)
		if (p >= b->base && p - b->base < b->size && n <= b->size - (p - b->base))
			return b;
	return NULL;
}

static const char *const names[][2] = {
	{"CUDA_SUCCESS", "no error"},
	{"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
};

static CUresult cuGetErrorName(CUresult r, const char **s)
{
	CALLED(cuGetErrorName);
	if (r == 100) {
		*s = "CUDA_ERROR_NO_DEVICE";
		return OK;
	}
	if (r < 0 || r > 2)
		return INVALID_VALUE;
	*s = names[r][0];
	return OK;
}

static CUresult cuGetErrorString(CUresult r, const char **s)
{
	CALLED(cuGetErrorString);
	if (r == 100) {
		*s = "no CUDA-capable device is detected";
		return OK;
	}
	if (r < 0 || r > 2)
		return INVALID_VALUE;
	*s = names[r][1];
	return OK;
}

static CUresult cuDeviceGetCount(int *n)
{
	CALLED(cuDeviceGetCount);
	*n = NDEV;
	return OK;
}

static CUresult cuDeviceGet(int *d, int ordinal)
{
	CALLED(cuDeviceGet);
	if (ordinal < 0 || ordinal >= NDEV)
		return INVALID_DEVICE;
	*d = ordinal;
	return OK;
}

static CUresult cuDeviceGetAttribute(int *v, int attr, int d)
{
	CALLED(cuDeviceGetAttribute);
	if (d < 0 || d >= NDEV)
		return INVALID_DEVICE;
	*v = attr == 16 ? 132 : attr == 33 ? 0x18 + d : attr == 75 ? 9 : 1;
	return OK;
}

static CUresult cuDeviceGetName(char *name, int len, int d)
{
	CALLED(cuDeviceGetName);
	if (d < 0 || d >= NDEV || len <= 0)
		return INVALID_VALUE;
	strncpy(name, "Fake GPU", (size_t)len - 1);
	name[len - 1] = 0;
	return OK;
}

static CUresult cuDeviceGetPCIBusId(char *id, int len, int d)
{
	CALLED(cuDeviceGetPCIBusId);
	static const char *const ids[NDEV] = {"0000:18:00.0", "0000:19:00.0"};
	if (d < 0 || d >= NDEV || len <= 0)
		return INVALID_VALUE;
	strncpy(id, ids[d], (size_t)len - 1);
	id[len - 1] = 0;
	return OK;
}

static CUresult cuDeviceCanAccessPeer(int *can, int d, int peer)
{
	CALLED(cuDeviceCanAccessPeer);
	*can = d != peer;
	return OK;
}

static CUresult cuDevicePrimaryCtxRetain(void **c, int d)
{
	CALLED(cuDevicePrimaryCtxRetain);
	if (d < 0 || d >= NDEV)
		return INVALID_DEVICE;
	*c = &contexts[d];
	return OK;
}

static CUresult cuDevicePrimaryCtxRelease(int d)
{
	CALLED(cuDevicePrimaryCtxRelease);
	return d < 0 || d >= NDEV ? INVALID_DEVICE : OK;
}

static CUresult cuCtxSetCurrent(void *c)
{
	CALLED(cuCtxSetCurrent);
	if (c != NULL && (c < (void *)&contexts[0] || c > (void *)&contexts[NDEV - 1]))
		return INVALID_CONTEXT;
	current = c;
	return OK;
}

static CUresult cuCtxGetCurrent(void **c)
{
	CALLED(cuCtxGetCurrent);
	*c = current;
	return OK;
}

static CUresult cuCtxGetDevice(int *d)
{
	CALLED(cuCtxGetDevice);
	if (current == NULL)
		return INVALID_CONTEXT;
	*d = (int)(current - contexts);
	return OK;
}

static CUresult cuCtxEnablePeerAccess(void *peer, unsigned flags)
{
	CALLED(cuCtxEnablePeerAccess);
	(void)flags;
	return peer == NULL ? INVALID_CONTEXT : OK;
}

static CUresult cuMemAlloc(CUdeviceptr *p, size_t n)
{
	CALLED(cuMemAlloc);
	if (current == NULL)
		return INVALID_CONTEXT;
	block *b = malloc(sizeof(*b));
	void *mem = n > 0 ? calloc(1, n) : NULL;
	if (b == NULL || mem == NULL) {
		free(b);
		free(mem);
		return n > 0 ? OUT_OF_MEMORY : INVALID_VALUE;
	}
	b->base = (uintptr_t)mem;
	b->size = n;
	b->device = (int)(current - contexts);
	b->vmm = 0;
	pthread_mutex_lock(&mu);
	b->next = blocks;
	blocks = b;
	pthread_mutex_unlock(&mu);
	*p = (CUdeviceptr)b->base;
	return OK;
}

static CUresult cuMemFree(CUdeviceptr p)
{
	CALLED(cuMemFree);
	pthread_mutex_lock(&mu);
	for (block **at = &blocks; *at != NULL; at = &(*at)->next) {
		block *b = *at;
		if (b->base == (uintptr_t)p && !b->vmm) {
			*at = b->next;
			pthread_mutex_unlock(&mu);
			free((void *)b->base);
			free(b);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}

static CUresult cuMemHostRegister(void *p, size_t n, unsigned flags)
{
	CALLED(cuMemHostRegister);
	(void)flags;
	return p == NULL || n == 0 ? INVALID_VALUE : OK;
}

static CUresult cuMemHostUnregister(void *p)
{
	CALLED(cuMemHostUnregister);
	return p == NULL ? INVALID_VALUE : OK;
}

static CUresult cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned flags)
{
	CALLED(cuMemHostGetDevicePointer);
	(void)flags;
	*d = (CUdeviceptr)(uintptr_t)p;
	return OK;
}

static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	if (n == 0)
		return OK;
	if (dst == 0 || src == 0)
		return INVALID_VALUE;
	memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
	return OK;
}

static CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)
{
	CALLED(cuMemcpyHtoD);
	return copy(dst, (CUdeviceptr)(uintptr_t)src, n);
}

static CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
	CALLED(cuMemcpyDtoH);
	return copy((CUdeviceptr)(uintptr_t)dst, src, n);
}

static CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, void *s)
{
	CALLED(cuMemcpyHtoDAsync);
	if (stream_ok(s) && stalled(s))
		return OK;
	return stream_ok(s) ? copy(dst, (CUdeviceptr)(uintptr_t)src, n) : INVALID_HANDLE;
}

static CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned v, size_t n, void *s)
{
	CALLED(cuMemsetD32Async);
	if (!stream_ok(s))
		return INVALID_HANDLE;
	if (stalled(s))
		return OK;
	uint32_t *p = (uint32_t *)(uintptr_t)dst;
	for (size_t i = 0; i < n; i++)
		p[i] = v;
	return OK;
}

static CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s)
{
	CALLED(cuMemcpyAsync);
	if (stream_ok(s) && stalled(s))
		return OK;
	return stream_ok(s) ? copy(dst, src, n) : INVALID_HANDLE;
}

static CUresult cuMemcpyPeerAsync(CUdeviceptr dst, void *dctx, CUdeviceptr src, void *sctx, size_t n, void *s)
{
	CALLED(cuMemcpyPeerAsync);
	if (dctx == NULL || sctx == NULL)
		return INVALID_CONTEXT;
	return stream_ok(s) ? copy(dst, src, n) : INVALID_HANDLE;
}

typedef struct {
	int srcAccessOrder;
	int loc[4];
	unsigned flags;
} attributes;

static CUresult batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, attributes *attrs,
		      size_t *idxs, size_t nattrs, size_t *fail, void *s)
{
	if (count == 0 || nattrs != 1 || idxs[0] != 0 || attrs[0].srcAccessOrder != 1 || !stream_ok(s))
		return INVALID_VALUE;
	if (stalled(s))
		return OK;
	for (size_t i = 0; i < count; i++) {
		CUresult r = copy(dsts[i], srcs[i], sizes[i]);
		if (r != OK) {
			if (fail != NULL)
				*fail = i;
			return r;
		}
	}
	return OK;
}

static CUresult cuMemcpyBatchAsync_v13000(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
					  attributes *attrs, size_t *idxs, size_t nattrs, void *s)
{
	CALLED(cuMemcpyBatchAsync_v13000);
	return batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, NULL, s);
}

static CUresult cuMemcpyBatchAsync_v12080(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
					  attributes *attrs, size_t *idxs, size_t nattrs, size_t *fail, void *s)
{
	CALLED(cuMemcpyBatchAsync_v12080);
	return batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, fail, s);
}

static CUresult cuStreamCreate(void **s, unsigned flags)
{
	CALLED(cuStreamCreate);
	(void)flags;
	*s = new_object(MAGIC_STREAM, NULL);
	return *s == NULL ? OUT_OF_MEMORY : OK;
}

static CUresult cuStreamDestroy(void *s)
{
	CALLED(cuStreamDestroy);
	return free_object(s, MAGIC_STREAM);
}

static CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags)
{
	CALLED(cuStreamWaitEvent);
	(void)flags;
	if (!stream_ok(s) || !is(e, MAGIC_EVENT))
		return INVALID_HANDLE;
	int id = stalled(e);
	if (id != 0 && is(s, MAGIC_STREAM) && !stalled(s))
		join_stall(s, id);
	return OK;
}

static CUresult cuStreamSynchronize(void *s)
{
	CALLED(cuStreamSynchronize);
	if (!stream_ok(s))
		return INVALID_HANDLE;
	wait_stall(s);
	return OK;
}

static CUresult cuStreamWriteValue64(void *s, CUdeviceptr addr, uint64_t v, unsigned flags)
{
	CALLED(cuStreamWriteValue64);
	(void)flags;
	if (!stream_ok(s))
		return INVALID_HANDLE;
	const char *no = getenv("PXN_FAKECUDA_NO_MEMOPS");
	if (no != NULL && strcmp(no, "1") == 0)
		return NOT_SUPPORTED;
	if (addr == 0 || addr % 8 != 0)
		return INVALID_VALUE;
	if (stalled(s))
		return OK;
	__atomic_store_n((uint64_t *)(uintptr_t)addr, v, __ATOMIC_RELEASE);
	return OK;
}

static CUresult cuEventCreate(void **e, unsigned flags)
{
	CALLED(cuEventCreate);
	(void)flags;
	*e = new_object(MAGIC_EVENT, NULL);
	return *e == NULL ? OUT_OF_MEMORY : OK;
}

static CUresult cuEventRecord(void *e, void *s)
{
	CALLED(cuEventRecord);
	if (!is(e, MAGIC_EVENT) || !stream_ok(s))
		return INVALID_HANDLE;
	join_stall(e, stalled(s));
	return OK;
}

static CUresult cuEventQuery(void *e)
{
	CALLED(cuEventQuery);
	if (!is(e, MAGIC_EVENT))
		return INVALID_HANDLE;
	return stalled(e) ? NOT_READY : OK;
}

static CUresult cuEventSynchronize(void *e)
{
	CALLED(cuEventSynchronize);
	if (!is(e, MAGIC_EVENT))
		return INVALID_HANDLE;
	wait_stall(e);
	return OK;
}

static CUresult cuEventDestroy(void *e)
{
	CALLED(cuEventDestroy);
	return free_object(e, MAGIC_EVENT);
}

/* A handle names the allocation's base; this driver opens its own. */
static CUresult cuIpcGetMemHandle(char h[64], CUdeviceptr p)
{
	CALLED(cuIpcGetMemHandle);
	pthread_mutex_lock(&mu);
	block *b = find((uintptr_t)p, 1);
	pthread_mutex_unlock(&mu);
	if (b == NULL || b->base != (uintptr_t)p)
		return INVALID_VALUE;
	memset(h, 0, 64);
	memcpy(h, "fakeipc", 8);
	memcpy(h + 8, &p, sizeof(p));
	return OK;
}

typedef struct {
	char reserved[64];
} ipc_handle;

static CUresult cuIpcOpenMemHandle(CUdeviceptr *p, ipc_handle h, unsigned flags)
{
	CALLED(cuIpcOpenMemHandle);
	(void)flags;
	if (memcmp(h.reserved, "fakeipc", 8) != 0)
		return INVALID_VALUE;
	memcpy(p, h.reserved + 8, sizeof(*p));
	return OK;
}

static CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	CALLED(cuIpcCloseMemHandle);
	return p == 0 ? INVALID_VALUE : OK;
}

static CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
	CALLED(cuPointerGetAttribute);
	pthread_mutex_lock(&mu);
	block *b = find((uintptr_t)p, 1);
	block found = b != NULL ? *b : (block){0};
	pthread_mutex_unlock(&mu);
	if (b == NULL)
		return INVALID_VALUE;
	switch (attr) {
	case 2:
		*(unsigned *)data = 2;
		return OK;
	case 9:
		*(int *)data = found.device;
		return OK;
	case 11:
		*(CUdeviceptr *)data = (CUdeviceptr)found.base;
		return OK;
	case 12:
		*(size_t *)data = found.size;
		return OK;
	}
	return INVALID_VALUE;
}

/*
 * As the real driver: a pointer it does not know is no error, every value
 * is zero instead.
 */
static CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p)
{
	CALLED(cuPointerGetAttributes);
	if (n == 0 || attrs == NULL || data == NULL)
		return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	block *b = find((uintptr_t)p, 1);
	block found = b != NULL ? *b : (block){0};
	pthread_mutex_unlock(&mu);
	for (unsigned i = 0; i < n; i++) {
		switch (attrs[i]) {
		case 2:
			*(unsigned *)data[i] = b != NULL ? 2 : 0;
			break;
		case 9:
			*(int *)data[i] = found.device;
			break;
		case 11:
			*(CUdeviceptr *)data[i] = (CUdeviceptr)found.base;
			break;
		case 12:
			*(size_t *)data[i] = found.size;
			break;
		default:
			return INVALID_VALUE;
		}
	}
	return OK;
}

static CUresult cuModuleLoadData(void **m, const void *image)
{
	CALLED(cuModuleLoadData);
	if (image == NULL || ((const char *)image)[0] == 0)
		return INVALID_VALUE;
	*m = new_object(MAGIC_MODULE, NULL);
	return *m == NULL ? OUT_OF_MEMORY : OK;
}

static CUresult cuModuleGetFunction(void **f, void *m, const char *name)
{
	CALLED(cuModuleGetFunction);
	if (!is(m, MAGIC_MODULE))
		return INVALID_HANDLE;
	/* A function lives as long as the library: nothing frees one. */
	static object gather = {MAGIC_FUNCTION, "pxn_gather", 0}, gather_inline = {MAGIC_FUNCTION, "pxn_gather_inline", 0};
	if (strcmp(name, gather.name) == 0)
		*f = &gather;
	else if (strcmp(name, gather_inline.name) == 0)
		*f = &gather_inline;
	else
		return NOT_FOUND;
	return OK;
}

static CUresult cuModuleUnload(void *m)
{
	CALLED(cuModuleUnload);
	return free_object(m, MAGIC_MODULE);
}

typedef struct {
	uint64_t src, dst, len;
} entry;

/* gather.cu's pxn_inline_plan, 512 entries. */
typedef struct {
	uint64_t words, seq, arrived;
	uint32_t n, parts;
	uint64_t cuts[8];
	entry entries[512];
	uint64_t prefix[513];
	uint64_t bell;
} inline_plan;

/*
 * gather runs the kernel's contract: the n entries in parts ending at cuts,
 * seq stored at words[p] after part p but the last (words 0: none).
 */
static CUresult gather(const entry *plan, const uint64_t *prefix, uint32_t n, const uint64_t *cuts, uint32_t parts, uint64_t words,
		       uint64_t seq, uint64_t bell)
{
	if (parts == 0 || parts > 8 || (parts > 1 && words != 0 && (words & 7) != 0) || (bell & 7) != 0)
		return LAUNCH_FAILED;
	uint64_t total = 0;
	uint32_t p = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (prefix[i] != total || plan[i].len == 0)
			return LAUNCH_FAILED;
		while (p + 1 < parts && cuts[p] <= total) {
			if (cuts[p] != total)
				return LAUNCH_FAILED; /* the engine cuts between entries */
			if (words != 0)
				__atomic_store_n((uint64_t *)(uintptr_t)(words + 8 * p), seq, __ATOMIC_RELEASE);
			p++;
		}
		total += plan[i].len;
		CUresult r = copy(plan[i].dst, plan[i].src, plan[i].len);
		if (r != OK)
			return LAUNCH_FAILED;
	}
	if (prefix[n] != total || p + 1 != parts || cuts[parts - 1] != total)
		return LAUNCH_FAILED;
	if (bell != 0)
		__atomic_store_n((uint64_t *)(uintptr_t)bell, seq, __ATOMIC_RELEASE);
	return OK;
}

static CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			       unsigned shmem, void *s, void **params, void **extra)
{
	CALLED(cuLaunchKernel);
	(void)shmem;
	if (!is(f, MAGIC_FUNCTION) || !stream_ok(s))
		return INVALID_HANDLE;
	if (gx == 0 || gy != 1 || gz != 1 || bx == 0 || by != 1 || bz != 1 || params == NULL || extra != NULL)
		return INVALID_VALUE;
	if (stalled(s))
		return OK;
	if (strcmp(((object *)f)->name, "pxn_gather_inline") == 0) {
		const inline_plan *ip = (const inline_plan *)params[0];
		if (ip->n > 512)
			return LAUNCH_FAILED;
		return gather(ip->entries, ip->prefix, ip->n, ip->cuts, ip->parts, ip->words, ip->seq, ip->bell);
	}
	const entry *plan = *(const entry *const *)params[0];
	const uint64_t *prefix = *(const uint64_t *const *)params[1];
	uint32_t n = *(const uint32_t *)params[2];
	const uint64_t *cuts = *(const uint64_t *const *)params[3];
	uint32_t parts = *(const uint32_t *)params[4];
	uint64_t words = *(const uint64_t *)params[6];
	uint64_t seq = *(const uint64_t *)params[7];
	uint64_t bell = *(const uint64_t *)params[8];
	return gather(plan, prefix, n, cuts, parts, words, seq, bell);
}

/* Virtual memory management (PXN_FAKECUDA_VMM=1). */

#define MAGIC_ALLOCATION 0xa11cu
#define GRANULARITY ((size_t)2 << 20)
#define MEMFD_PREFIX "fakecuda-mem-dev"

typedef struct {
	int type;
	int id;
} mem_location;

typedef struct {
	int type;
	int requestedHandleTypes;
	mem_location location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} allocation_prop;

typedef struct {
	mem_location location;
	int flags;
} access_desc;

/* An allocation is a memfd of its size; a handle is its address. */
typedef struct {
	unsigned magic;
	int fd;
	size_t size;
	int device;
} allocation;

typedef struct reservation {
	uintptr_t base;
	size_t size;
	struct reservation *next;
} reservation;

static reservation *reservations;

static int vmm_enabled(void)
{
	const char *v = getenv("PXN_FAKECUDA_VMM");
	return v != NULL && strcmp(v, "1") == 0;
}

static int prop_ok(const allocation_prop *p)
{
	return p != NULL && p->type == 1 && p->location.type == 1 && p->location.id >= 0 && p->location.id < NDEV &&
	       (p->requestedHandleTypes & 1) != 0;
}

static allocation *allocation_of(unsigned long long h)
{
	allocation *a = (allocation *)(uintptr_t)h;
	return a != NULL && a->magic == MAGIC_ALLOCATION ? a : NULL;
}

static CUresult cuMemGetAllocationGranularity(size_t *g, const allocation_prop *prop, int option)
{
	CALLED(cuMemGetAllocationGranularity);
	if (g == NULL || !prop_ok(prop) || (option != 0 && option != 1))
		return INVALID_VALUE;
	*g = GRANULARITY;
	return OK;
}

static CUresult new_allocation(unsigned long long *h, int fd, size_t size, int device)
{
	allocation *a = malloc(sizeof(*a));
	if (a == NULL)
		return OUT_OF_MEMORY;
	a->magic = MAGIC_ALLOCATION;
	a->fd = fd;
	a->size = size;
	a->device = device;
	*h = (unsigned long long)(uintptr_t)a;
	return OK;
}

static CUresult cuMemCreate(unsigned long long *h, size_t size, const allocation_prop *prop, unsigned long long flags)
{
	CALLED(cuMemCreate);
	char name[32];
	if (h == NULL || !prop_ok(prop) || flags != 0 || size == 0 || size % GRANULARITY != 0)
		return INVALID_VALUE;
	snprintf(name, sizeof(name), MEMFD_PREFIX "%d", prop->location.id);
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0)
		return OUT_OF_MEMORY;
	if (ftruncate(fd, (off_t)size) != 0) {
		close(fd);
		return OUT_OF_MEMORY;
	}
	CUresult r = new_allocation(h, fd, size, prop->location.id);
	if (r != OK)
		close(fd);
	return r;
}

/* The memory lives on while a mapping of it does, as with the real driver. */
static CUresult cuMemRelease(unsigned long long h)
{
	CALLED(cuMemRelease);
	allocation *a = allocation_of(h);
	if (a == NULL)
		return INVALID_VALUE;
	a->magic = 0;
	close(a->fd);
	free(a);
	return OK;
}

static CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags)
{
	CALLED(cuMemAddressReserve);
	if (p == NULL || size == 0 || size % GRANULARITY != 0 || addr != 0 || flags != 0 || (align & (align - 1)) != 0)
		return INVALID_VALUE;
	size_t a = align > GRANULARITY ? align : GRANULARITY;
	reservation *r = malloc(sizeof(*r));
	if (r == NULL)
		return OUT_OF_MEMORY;
	void *m = mmap(NULL, size + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		free(r);
		return OUT_OF_MEMORY;
	}
	uintptr_t start = ((uintptr_t)m + a - 1) & ~(uintptr_t)(a - 1);
	if (start > (uintptr_t)m)
		munmap(m, start - (uintptr_t)m);
	if ((uintptr_t)m + size + a > start + size)
		munmap((void *)(start + size), (uintptr_t)m + size + a - (start + size));
	r->base = start;
	r->size = size;
	pthread_mutex_lock(&mu);
	r->next = reservations;
	reservations = r;
	pthread_mutex_unlock(&mu);
	*p = (CUdeviceptr)start;
	return OK;
}

static CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
	CALLED(cuMemAddressFree);
	pthread_mutex_lock(&mu);
	for (reservation **at = &reservations; *at != NULL; at = &(*at)->next) {
		reservation *r = *at;
		if (r->base == (uintptr_t)p && r->size == size) {
			*at = r->next;
			pthread_mutex_unlock(&mu);
			munmap((void *)r->base, r->size);
			free(r);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}

/* Whether [p, p+n) lies in one reservation; called with mu held. */
static int reserved(uintptr_t p, size_t n)
{
	for (reservation *r = reservations; r != NULL; r = r->next)
		if (p >= r->base && p - r->base < r->size && n <= r->size - (p - r->base))
			return 1;
	return 0;
}

/* Whether any mapping overlaps [p, p+n); called with mu held. */
static int overlaps(uintptr_t p, size_t n)
{
	for (block *b = blocks; b != NULL; b = b->next)
		if (p < b->base + b->size && b->base < p + n)
			return 1;
	return 0;
}

static CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, unsigned long long h, unsigned long long flags)
{
	CALLED(cuMemMap);
	allocation *a = allocation_of(h);
	if (a == NULL)
		return INVALID_HANDLE;
	/* The real driver maps an allocation from its start only. */
	if (offset != 0 || flags != 0 || size == 0 || size % GRANULARITY != 0 || p % GRANULARITY != 0 || size > a->size)
		return INVALID_VALUE;
	block *b = malloc(sizeof(*b));
	if (b == NULL)
		return OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	if (!reserved((uintptr_t)p, size) || overlaps((uintptr_t)p, size)) {
		pthread_mutex_unlock(&mu);
		free(b);
		return INVALID_VALUE;
	}
	if (mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, 0) == MAP_FAILED) {
		pthread_mutex_unlock(&mu);
		free(b);
		return OUT_OF_MEMORY;
	}
	b->base = (uintptr_t)p;
	b->size = size;
	b->device = a->device;
	b->vmm = 1;
	b->next = blocks;
	blocks = b;
	pthread_mutex_unlock(&mu);
	return OK;
}

static CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
	CALLED(cuMemUnmap);
	pthread_mutex_lock(&mu);
	for (block **at = &blocks; *at != NULL; at = &(*at)->next) {
		block *b = *at;
		if (b->vmm && b->base == (uintptr_t)p && b->size == size) {
			*at = b->next;
			mmap((void *)b->base, b->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
			pthread_mutex_unlock(&mu);
			free(b);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}

/* Every byte of the range must be mapped. */
static CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const access_desc *desc, size_t count)
{
	CALLED(cuMemSetAccess);
	if (size == 0 || desc == NULL || count == 0)
		return INVALID_VALUE;
	for (size_t i = 0; i < count; i++)
		if (desc[i].location.type != 1 || desc[i].location.id < 0 || desc[i].location.id >= NDEV ||
		    (desc[i].flags != 0 && desc[i].flags != 1 && desc[i].flags != 3))
			return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	for (uintptr_t q = (uintptr_t)p; q < (uintptr_t)p + size;) {
		block *b = find(q, 1);
		if (b == NULL || !b->vmm) {
			pthread_mutex_unlock(&mu);
			return INVALID_VALUE;
		}
		q = b->base + b->size;
	}
	int prot = desc[count - 1].flags == 3 ? PROT_READ | PROT_WRITE : desc[count - 1].flags == 1 ? PROT_READ : PROT_NONE;
	int r = mprotect((void *)(uintptr_t)p, size, prot);
	pthread_mutex_unlock(&mu);
	return r == 0 ? OK : INVALID_VALUE;
}

/* A POSIX descriptor, not close-on-exec, as the real driver's may be. */
static CUresult cuMemExportToShareableHandle(void *shareable, unsigned long long h, int type, unsigned long long flags)
{
	CALLED(cuMemExportToShareableHandle);
	allocation *a = allocation_of(h);
	if (a == NULL)
		return INVALID_HANDLE;
	if (shareable == NULL || type != 1 || flags != 0)
		return INVALID_VALUE;
	int fd = dup(a->fd);
	if (fd < 0)
		return OUT_OF_MEMORY;
	*(int *)shareable = fd;
	return OK;
}

/* Only a descriptor this driver exported imports: anything else, a file
 * or another memfd among them, is refused. */
static CUresult cuMemImportFromShareableHandle(unsigned long long *h, void *os_handle, int type)
{
	CALLED(cuMemImportFromShareableHandle);
	char path[64], target[128];
	int fd = (int)(intptr_t)os_handle, device;
	struct stat st;
	if (h == NULL || type != 1 || fd < 0)
		return INVALID_VALUE;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, target, sizeof(target) - 1);
	if (n <= 0)
		return INVALID_VALUE;
	target[n] = 0;
	if (sscanf(target, "/memfd:" MEMFD_PREFIX "%d", &device) != 1 || device < 0 || device >= NDEV)
		return INVALID_VALUE;
	if (fstat(fd, &st) != 0 || st.st_size <= 0 || (size_t)st.st_size % GRANULARITY != 0)
		return INVALID_VALUE;
	int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (own < 0)
		return OUT_OF_MEMORY;
	CUresult r = new_allocation(h, own, (size_t)st.st_size, device);
	if (r != OK)
		close(own);
	return r;
}

static CUresult cuMemGetAllocationPropertiesFromHandle(allocation_prop *prop, unsigned long long h)
{
	CALLED(cuMemGetAllocationPropertiesFromHandle);
	allocation *a = allocation_of(h);
	if (a == NULL)
		return INVALID_HANDLE;
	if (prop == NULL)
		return INVALID_VALUE;
	memset(prop, 0, sizeof(*prop));
	prop->type = 1;
	prop->requestedHandleTypes = 1;
	prop->location.type = 1;
	prop->location.id = a->device;
	return OK;
}

static CUresult cuMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
	CALLED(cuMemGetInfo);
	*free_bytes = (size_t)1 << 36;
	*total_bytes = (size_t)1 << 37;
	return OK;
}

static int driver_version(void)
{
	const char *v = getenv("PXN_FAKECUDA_VERSION");
	return v != NULL ? atoi(v) : 13000;
}

CUresult cuDriverGetVersion(int *v)
{
	*v = driver_version();
	return OK;
}

static void map_call_counts(void);

CUresult cuInit(unsigned flags)
{
	const char *r = getenv("PXN_FAKECUDA_INIT");
	if (flags != 0)
		return INVALID_VALUE;
	map_call_counts();
	return r != NULL ? atoi(r) : OK;
}

#define ENTRY(fn, min) {#fn, min, (void *)fn, 0}
#define VMM_ENTRY(fn, min) {#fn, min, (void *)fn, 1}

static const struct {
	const char *name;
	int version;
	void *fn;
	int vmm;
} entries[] = {
	ENTRY(cuGetErrorName, 6000),
	ENTRY(cuGetErrorString, 6000),
	ENTRY(cuDeviceGetCount, 2000),
	ENTRY(cuDeviceGet, 2000),
	ENTRY(cuDeviceGetAttribute, 2000),
	ENTRY(cuDeviceGetName, 2000),
	ENTRY(cuDeviceGetPCIBusId, 4010),
	ENTRY(cuDeviceCanAccessPeer, 4000),
	ENTRY(cuDevicePrimaryCtxRetain, 7000),
	ENTRY(cuDevicePrimaryCtxRelease, 11000),
	ENTRY(cuCtxSetCurrent, 4000),
	ENTRY(cuCtxGetCurrent, 4000),
	ENTRY(cuCtxGetDevice, 2000),
	ENTRY(cuCtxEnablePeerAccess, 4000),
	ENTRY(cuMemAlloc, 3020),
	ENTRY(cuMemFree, 3020),
	ENTRY(cuMemHostRegister, 6050),
	ENTRY(cuMemHostUnregister, 4000),
	ENTRY(cuMemHostGetDevicePointer, 3020),
	ENTRY(cuMemcpyHtoD, 3020),
	ENTRY(cuMemcpyDtoH, 3020),
	ENTRY(cuMemcpyHtoDAsync, 3020),
	ENTRY(cuMemsetD32Async, 3020),
	ENTRY(cuMemcpyAsync, 4000),
	{"cuMemcpyDtoDAsync", 3020, (void *)cuMemcpyAsync, 0},
	ENTRY(cuMemcpyPeerAsync, 4000),
	{"cuMemcpyBatchAsync", 13000, (void *)cuMemcpyBatchAsync_v13000, 0},
	{"cuMemcpyBatchAsync", 12080, (void *)cuMemcpyBatchAsync_v12080, 0},
	ENTRY(cuStreamCreate, 2000),
	ENTRY(cuStreamDestroy, 4000),
	ENTRY(cuStreamWaitEvent, 3020),
	ENTRY(cuStreamSynchronize, 2000),
	ENTRY(cuStreamWriteValue64, 12000),
	ENTRY(cuEventCreate, 2000),
	ENTRY(cuEventRecord, 2000),
	ENTRY(cuEventQuery, 2000),
	ENTRY(cuEventSynchronize, 2000),
	ENTRY(cuEventDestroy, 4000),
	ENTRY(cuIpcGetMemHandle, 4010),
	ENTRY(cuIpcOpenMemHandle, 11000),
	ENTRY(cuIpcCloseMemHandle, 4010),
	ENTRY(cuPointerGetAttribute, 4000),
	ENTRY(cuPointerGetAttributes, 7000),
	ENTRY(cuModuleLoadData, 2000),
	ENTRY(cuModuleGetFunction, 2000),
	ENTRY(cuModuleUnload, 2000),
	ENTRY(cuLaunchKernel, 4000),
	ENTRY(cuMemGetInfo, 3020),
	VMM_ENTRY(cuMemGetAllocationGranularity, 10020),
	VMM_ENTRY(cuMemCreate, 10020),
	VMM_ENTRY(cuMemRelease, 10020),
	VMM_ENTRY(cuMemAddressReserve, 10020),
	VMM_ENTRY(cuMemAddressFree, 10020),
	VMM_ENTRY(cuMemMap, 10020),
	VMM_ENTRY(cuMemUnmap, 10020),
	VMM_ENTRY(cuMemSetAccess, 10020),
	VMM_ENTRY(cuMemExportToShareableHandle, 10020),
	VMM_ENTRY(cuMemImportFromShareableHandle, 10020),
	VMM_ENTRY(cuMemGetAllocationPropertiesFromHandle, 10020),
};

#define NENTRIES (sizeof(entries) / sizeof(entries[0]))

static int entry_of(void *fn)
{
	for (size_t i = 0; i < NENTRIES; i++)
		if (entries[i].fn == fn)
			return (int)i;
	return -1;
}

/*
 * map_call_counts maps the file PXN_FAKECUDA_CALLS names, sized and named
 * here, and counts into it from now on. A mapping it replaces stays
 * mapped: a call in flight may still count into it.
 */
static void map_call_counts(void)
{
	const char *path = getenv("PXN_FAKECUDA_CALLS");
	if (path == NULL || *path == 0)
		return;
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	size_t size = NENTRIES * sizeof(call_record);
	void *m = MAP_FAILED;
	if (ftruncate(fd, (off_t)size) == 0)
		m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return;
	call_record *c = m;
	for (size_t i = 0; i < NENTRIES; i++) {
		memset(c[i].name, 0, sizeof(c[i].name));
		strncpy(c[i].name, entries[i].name, sizeof(c[i].name) - 1);
		c[i].count = 0;
	}
	__atomic_store_n(&ncall_counts, NENTRIES, __ATOMIC_RELAXED);
	__atomic_store_n(&call_counts, c, __ATOMIC_RELEASE);
}

/*
 * The newest form of name no newer than version and the driver: what a
 * real driver hands out (cuMemcpyBatchAsync has a 12.8 and a 13.0 form).
 */
CUresult cuGetProcAddress_v2(const char *name, void **fn, int version, uint64_t flags, int *status)
{
	int best = -1;
	if (name == NULL || fn == NULL || flags != 1)
		return INVALID_VALUE;
	for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++)
		if (strcmp(entries[i].name, name) == 0 && (!entries[i].vmm || vmm_enabled()) && entries[i].version <= version &&
		    entries[i].version <= driver_version() && (best < 0 || entries[i].version > entries[best].version))
			best = (int)i;
	*fn = best < 0 ? NULL : entries[best].fn;
	if (status != NULL)
		*status = best < 0 ? 1 : 0;
	return best < 0 ? NOT_FOUND : OK;
}
