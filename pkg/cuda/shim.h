// SPDX-License-Identifier: Apache-2.0

/*
 * The CUDA driver API as this package uses it, declared by hand: no CUDA
 * header or library is needed at build time. Every entry point is resolved
 * at run time (shim.c) and called through a trampoline that returns
 * PXN_CU_NOT_AVAILABLE when the driver lacks the symbol.
 */
#ifndef PXN_CUDA_SHIM_H
#define PXN_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;

/* Handles cross the cgo boundary as integers, never as Go pointers. */
typedef uintptr_t pxn_handle;

typedef struct {
	char reserved[64];
} CUipcMemHandle;

typedef struct {
	int type;
	int id;
} CUmemLocation;

/* CUmemGenericAllocationHandle: an allocation made with cuMemCreate. */
typedef unsigned long long CUmemGenericAllocationHandle;

/* CUmemAllocationProp (CUDA 11.0 and later; 10.2's ends in a reserved
 * 64-bit word where allocFlags now lies, so the layout is the same). */
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

typedef struct {
	int srcAccessOrder;
	CUmemLocation srcLocHint;
	CUmemLocation dstLocHint;
	unsigned int flags;
} CUmemcpyAttributes;

/* Returned by a trampoline whose entry point the driver did not provide. */
#define PXN_CU_NOT_AVAILABLE (-1)

#define PXN_CU_SRC_ACCESS_ORDER_STREAM 1
/* CU_STREAM_LEGACY: the legacy default stream, whatever the caller's build. */
#define PXN_CU_STREAM_LEGACY ((pxn_handle)0x1)

/* Indices into pxn_cu_table.fn; the order matches pxn_cu_symbols in shim.c. */
enum {
	PXN_cuGetErrorName,
	PXN_cuGetErrorString,
	PXN_cuDeviceGetCount,
	PXN_cuDeviceGet,
	PXN_cuDeviceGetAttribute,
	PXN_cuDeviceGetName,
	PXN_cuDeviceGetPCIBusId,
	PXN_cuDeviceCanAccessPeer,
	PXN_cuDevicePrimaryCtxRetain,
	PXN_cuDevicePrimaryCtxRelease,
	PXN_cuCtxSetCurrent,
	PXN_cuCtxGetCurrent,
	PXN_cuCtxEnablePeerAccess,
	PXN_cuMemAlloc,
	PXN_cuMemFree,
	PXN_cuMemHostRegister,
	PXN_cuMemHostUnregister,
	PXN_cuMemHostGetDevicePointer,
	PXN_cuMemcpyHtoD,
	PXN_cuMemcpyDtoH,
	PXN_cuMemsetD32Async,
	PXN_cuMemcpyAsync,
	PXN_cuMemcpyDtoDAsync,
	PXN_cuMemcpyPeerAsync,
	PXN_cuMemcpyBatchAsync_v13000,
	PXN_cuMemcpyBatchAsync_v12080,
	PXN_cuStreamCreate,
	PXN_cuStreamDestroy,
	PXN_cuStreamWaitEvent,
	PXN_cuStreamSynchronize,
	PXN_cuStreamWriteValue64,
	PXN_cuEventCreate,
	PXN_cuEventRecord,
	PXN_cuEventQuery,
	PXN_cuEventSynchronize,
	PXN_cuEventDestroy,
	PXN_cuIpcGetMemHandle,
	PXN_cuIpcOpenMemHandle,
	PXN_cuIpcCloseMemHandle,
	PXN_cuPointerGetAttribute,
	PXN_cuModuleLoadData,
	PXN_cuModuleGetFunction,
	PXN_cuModuleUnload,
	PXN_cuLaunchKernel,
	PXN_cuMemGetInfo,
	PXN_cuMemcpyHtoDAsync,
	PXN_cuCtxGetDevice,
	PXN_cuMemGetAllocationGranularity,
	PXN_cuMemCreate,
	PXN_cuMemRelease,
	PXN_cuMemAddressReserve,
	PXN_cuMemAddressFree,
	PXN_cuMemMap,
	PXN_cuMemUnmap,
	PXN_cuMemSetAccess,
	PXN_cuMemExportToShareableHandle,
	PXN_cuMemImportFromShareableHandle,
	PXN_cuMemGetAllocationPropertiesFromHandle,
	PXN_cuPointerGetAttributes,
	PXN_CU_NSYM
};

typedef struct {
	void *lib;
	int driver_version;
	int proc_v2;
	void *fn[PXN_CU_NSYM];
} pxn_cu_table;

/* Symbol metadata, for the Go side's Symbols and docs/cuda.md. */
const char *pxn_cu_symbol_name(int i);
int pxn_cu_symbol_version(int i);
int pxn_cu_symbol_min_driver(int i);

/*
 * Opens the library and fills t. Returns 0 on success; otherwise a negative
 * step code (see load.go) and, where one applies, the CUresult in *res and
 * dlerror's text in err (errlen bytes).
 */
int pxn_cu_load(pxn_cu_table *t, const char *libname, CUresult *res, char *err, size_t errlen);
void pxn_cu_unload(pxn_cu_table *t);

CUresult pxn_cuGetErrorName(pxn_cu_table *t, CUresult r, const char **s);
CUresult pxn_cuGetErrorString(pxn_cu_table *t, CUresult r, const char **s);
CUresult pxn_cuDeviceGetCount(pxn_cu_table *t, int *n);
CUresult pxn_cuDeviceGet(pxn_cu_table *t, CUdevice *d, int ordinal);
CUresult pxn_cuDeviceGetAttribute(pxn_cu_table *t, int *v, int attr, CUdevice d);
CUresult pxn_cuDeviceGetName(pxn_cu_table *t, char *name, int len, CUdevice d);
CUresult pxn_cuDeviceGetPCIBusId(pxn_cu_table *t, char *id, int len, CUdevice d);
CUresult pxn_cuDeviceCanAccessPeer(pxn_cu_table *t, int *can, CUdevice d, CUdevice peer);
CUresult pxn_cuDevicePrimaryCtxRetain(pxn_cu_table *t, pxn_handle *c, CUdevice d);
CUresult pxn_cuDevicePrimaryCtxRelease(pxn_cu_table *t, CUdevice d);
CUresult pxn_cuCtxSetCurrent(pxn_cu_table *t, pxn_handle c);
CUresult pxn_cuCtxGetCurrent(pxn_cu_table *t, pxn_handle *c);
CUresult pxn_cuCtxGetDevice(pxn_cu_table *t, CUdevice *d);
CUresult pxn_cuCtxEnablePeerAccess(pxn_cu_table *t, pxn_handle peer, unsigned int flags);
CUresult pxn_cuMemAlloc(pxn_cu_table *t, CUdeviceptr *p, size_t n);
CUresult pxn_cuMemFree(pxn_cu_table *t, CUdeviceptr p);
CUresult pxn_cuMemHostRegister(pxn_cu_table *t, uintptr_t p, size_t n, unsigned int flags);
CUresult pxn_cuMemHostUnregister(pxn_cu_table *t, uintptr_t p);
CUresult pxn_cuMemHostGetDevicePointer(pxn_cu_table *t, CUdeviceptr *d, uintptr_t p, unsigned int flags);
CUresult pxn_cuMemcpyHtoD(pxn_cu_table *t, CUdeviceptr dst, const void *src, size_t n);
CUresult pxn_cuMemcpyDtoH(pxn_cu_table *t, void *dst, CUdeviceptr src, size_t n);
CUresult pxn_cuMemsetD32Async(pxn_cu_table *t, CUdeviceptr dst, unsigned int v, size_t n, pxn_handle s);
CUresult pxn_cuMemcpyAsync(pxn_cu_table *t, CUdeviceptr dst, CUdeviceptr src, size_t n, pxn_handle s);
CUresult pxn_cuMemcpyDtoDAsync(pxn_cu_table *t, CUdeviceptr dst, CUdeviceptr src, size_t n, pxn_handle s);
CUresult pxn_cuMemcpyPeerAsync(pxn_cu_table *t, CUdeviceptr dst, pxn_handle dctx, CUdeviceptr src, pxn_handle sctx, size_t n, pxn_handle s);
CUresult pxn_cuMemcpyBatchAsync_v13000(pxn_cu_table *t, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
	CUmemcpyAttributes *attrs, size_t *attrIdxs, size_t numAttrs, pxn_handle s);
CUresult pxn_cuMemcpyBatchAsync_v12080(pxn_cu_table *t, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
	CUmemcpyAttributes *attrs, size_t *attrIdxs, size_t numAttrs, size_t *failIdx, pxn_handle s);
CUresult pxn_cuStreamCreate(pxn_cu_table *t, pxn_handle *s, unsigned int flags);
CUresult pxn_cuStreamDestroy(pxn_cu_table *t, pxn_handle s);
CUresult pxn_cuStreamWaitEvent(pxn_cu_table *t, pxn_handle s, pxn_handle e, unsigned int flags);
CUresult pxn_cuStreamSynchronize(pxn_cu_table *t, pxn_handle s);
CUresult pxn_cuStreamWriteValue64(pxn_cu_table *t, pxn_handle s, CUdeviceptr addr, uint64_t v, unsigned int flags);
CUresult pxn_cuEventCreate(pxn_cu_table *t, pxn_handle *e, unsigned int flags);
CUresult pxn_cuEventRecord(pxn_cu_table *t, pxn_handle e, pxn_handle s);
CUresult pxn_cuEventQuery(pxn_cu_table *t, pxn_handle e);
CUresult pxn_cuEventSynchronize(pxn_cu_table *t, pxn_handle e);
CUresult pxn_cuEventDestroy(pxn_cu_table *t, pxn_handle e);
CUresult pxn_cuIpcGetMemHandle(pxn_cu_table *t, CUipcMemHandle *h, CUdeviceptr p);
CUresult pxn_cuIpcOpenMemHandle(pxn_cu_table *t, CUdeviceptr *p, const CUipcMemHandle *h, unsigned int flags);
CUresult pxn_cuIpcCloseMemHandle(pxn_cu_table *t, CUdeviceptr p);
CUresult pxn_cuPointerGetAttribute(pxn_cu_table *t, void *data, int attr, CUdeviceptr p);
CUresult pxn_cuPointerGetAttributes(pxn_cu_table *t, unsigned int n, int *attrs, void **data, CUdeviceptr p);
CUresult pxn_cuModuleLoadData(pxn_cu_table *t, pxn_handle *m, const void *image);
CUresult pxn_cuModuleGetFunction(pxn_cu_table *t, pxn_handle *f, pxn_handle m, const char *name);
CUresult pxn_cuModuleUnload(pxn_cu_table *t, pxn_handle m);
CUresult pxn_cuLaunchKernel(pxn_cu_table *t, pxn_handle f, unsigned int gx, unsigned int gy, unsigned int gz,
	unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, pxn_handle s,
	const uint64_t *args, int nargs);
CUresult pxn_cuMemGetInfo(pxn_cu_table *t, size_t *free_bytes, size_t *total_bytes);
CUresult pxn_cuMemcpyHtoDAsync(pxn_cu_table *t, CUdeviceptr dst, uintptr_t src, size_t n, pxn_handle s);

/* Virtual memory management: an arena that can be shared by descriptor. */
CUresult pxn_cuMemGetAllocationGranularity(pxn_cu_table *t, size_t *g, const CUmemAllocationProp *prop, int option);
CUresult pxn_cuMemCreate(pxn_cu_table *t, CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop);
CUresult pxn_cuMemRelease(pxn_cu_table *t, CUmemGenericAllocationHandle h);
CUresult pxn_cuMemAddressReserve(pxn_cu_table *t, CUdeviceptr *p, size_t size, size_t align);
CUresult pxn_cuMemAddressFree(pxn_cu_table *t, CUdeviceptr p, size_t size);
CUresult pxn_cuMemMap(pxn_cu_table *t, CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h);
CUresult pxn_cuMemUnmap(pxn_cu_table *t, CUdeviceptr p, size_t size);
CUresult pxn_cuMemSetAccess(pxn_cu_table *t, CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count);
/* POSIX descriptors only: the descriptor is returned in *fd. */
CUresult pxn_cuMemExportToShareableHandleFD(pxn_cu_table *t, int *fd, CUmemGenericAllocationHandle h);
CUresult pxn_cuMemImportFromShareableHandleFD(pxn_cu_table *t, CUmemGenericAllocationHandle *h, int fd);
CUresult pxn_cuMemGetAllocationPropertiesFromHandle(pxn_cu_table *t, CUmemAllocationProp *prop, CUmemGenericAllocationHandle h);

/* Composite calls: one cgo crossing for what a hot path does in a row. */

/* Makes ctx current on the calling thread unless it already is. */
CUresult pxn_ensure_ctx(pxn_cu_table *t, pxn_handle ctx);

/* Records e on s with ctx current (s 0 means the legacy default stream). */
CUresult pxn_record_event(pxn_cu_table *t, pxn_handle ctx, pxn_handle e, pxn_handle s);

/* Queries e with ctx current. */
CUresult pxn_query_event(pxn_cu_table *t, pxn_handle ctx, pxn_handle e);

/* One contiguous copy of the first hop; the layout of relay.CopyEntry. */
typedef struct {
	uint64_t src;
	uint64_t dst;
	uint64_t len;
} pxn_copy_entry;

enum {
	PXN_COPY_PER_ENTRY = 0,
	PXN_COPY_BATCH_V13000 = 1,
	PXN_COPY_BATCH_V12080 = 2,
	/* The SM gather kernel (pkg/gpu/kernel): plan upload, then one launch. */
	PXN_COPY_GATHER = 3
};

/* Stages of pxn_enqueue_piece, reported when a step fails. */
enum {
	PXN_STAGE_CONTEXT = 1,
	PXN_STAGE_WAIT = 2,
	PXN_STAGE_COPY = 3,
	PXN_STAGE_DOORBELL = 4,
	PXN_STAGE_RECORD = 5,
	PXN_STAGE_PLAN = 6,
	PXN_STAGE_LAUNCH = 7
};

/* The most parts a gather launch copies a Piece in (PXN_MAX_PARTS). */
#define PXN_GATHER_MAX_PARTS 8

/*
 * The most entries of a gather plan passed by value as the inline kernel's
 * parameter, and that parameter: the layout of gather.cu's pxn_inline_plan.
 */
#define PXN_INLINE_ENTRIES 512
typedef struct {
	CUdeviceptr words;
	uint64_t seq;
	CUdeviceptr arrived;
	uint32_t n;
	uint32_t parts;
	uint64_t cuts[PXN_GATHER_MAX_PARTS];
	pxn_copy_entry entries[PXN_INLINE_ENTRIES];
	uint64_t prefix[PXN_INLINE_ENTRIES + 1];
	CUdeviceptr bell;
} pxn_inline_plan;

typedef struct {
	size_t cap;
	CUdeviceptr *dsts;
	CUdeviceptr *srcs;
	size_t *sizes;
	/* The inline gather kernel's parameter, built per launch. */
	pxn_inline_plan *inline_plan;
} pxn_copy_scratch;

pxn_copy_scratch *pxn_scratch_new(size_t cap);
void pxn_scratch_free(pxn_copy_scratch *s);

/* Lives in C memory: one per lane stream, reused for every Piece. */
typedef struct {
	pxn_handle ctx;
	pxn_handle stream;
	pxn_handle wait;
	int mode;
	pxn_copy_scratch *scratch;
	CUdeviceptr doorbell;
	uint64_t seq;
	pxn_handle done;
	/*
	 * PXN_COPY_GATHER only. plan_host is pinned host memory and plan_dev
	 * device memory, each of pxn_plan_bytes(plan_cap) bytes. The plan is
	 * uploaded on the upload stream and plan_up recorded there; the stream
	 * waits for plan_up before the launch. plan_busy is recorded after the
	 * launch and must have completed before plan_host is written again.
	 */
	pxn_handle gather_fn;
	unsigned int grid;
	unsigned int block;
	uintptr_t plan_host;
	CUdeviceptr plan_dev;
	size_t plan_cap;
	pxn_handle upload;
	pxn_handle plan_up;
	pxn_handle plan_busy;
	/*
	 * gather_inline, when set, is the kernel that takes a plan of at most
	 * PXN_INLINE_ENTRIES entries as its parameter: such a Piece is launched
	 * with no upload (nor plan_up, plan_busy). arrived is the device
	 * address of the slot's PXN_GATHER_MAX_PARTS arrival counters, zero
	 * between launches (the kernel sets each back to 0), used by both
	 * kernels.
	 */
	pxn_handle gather_inline;
	CUdeviceptr arrived;
	/*
	 * Either gather kernel rings the doorbell itself when the op has one
	 * and arrival counters (the last part's counter, then a store of seq
	 * behind a system-scope fence), and no stream write follows the launch:
	 * under MPS a stream memory operation after each kernel costs more
	 * than the kernel's own signal (docs/cuda.md, "Starting the first
	 * hop"). kernel_bell is set by pxn_enqueue_piece when it did so.
	 */
	int kernel_bell;
	/*
	 * A Piece copied in parts (nparts > 1): cuts[p] is the byte where part
	 * p ends (cuts[nparts-1] the Piece's length), and the kernel stores seq
	 * at part_words + 8p once part p is written, for every part but the
	 * last (part_words 0: no stores). nparts 0 or 1: one part.
	 */
	unsigned int nparts;
	uint64_t cuts[PXN_GATHER_MAX_PARTS];
	CUdeviceptr part_words;
	/* Out: the stage that failed and, for the 12.8 batch form, failIdx. */
	int stage;
	size_t fail_idx;
} pxn_piece_op;

/*
 * Bytes of a gather plan of n entries: the non-empty entries, packed, then
 * their n+1 exclusive prefix sums of lengths (the last one is the total),
 * then room for the part cuts (u64) and the parts' arrival counters (u32).
 */
size_t pxn_plan_bytes(size_t n);

/*
 * Enqueues on op->stream: a wait for op->wait (if any), the n copies, then
 * the doorbell (if op->doorbell) and a record of op->done (if any). Stops at
 * the first failing step.
 */
CUresult pxn_enqueue_piece(pxn_cu_table *t, pxn_piece_op *op, const pxn_copy_entry *entries, size_t n);

/* Classifies [p, p+n): 2 when it lies in one device allocation, 1 for host. */
int pxn_classify(pxn_cu_table *t, pxn_handle ctx, CUdeviceptr p, uint64_t n);
/* pxn_classify's answer (kind), and for device memory the allocation
 * [start, start+size) holding p..p+n (zero otherwise). Returned by value,
 * so that a Go caller passes no pointer and allocates nothing. */
typedef struct {
	int kind;
	CUdeviceptr start;
	uint64_t size;
} pxn_range_class;
pxn_range_class pxn_classify_range(pxn_cu_table *t, pxn_handle ctx, CUdeviceptr p, uint64_t n);

#endif
