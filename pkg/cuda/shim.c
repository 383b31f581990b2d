// SPDX-License-Identifier: Apache-2.0

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_MEMORYTYPE_DEVICE 2
#define CUDA_ERROR_INVALID_VALUE 1

typedef CUresult (*pxn_getproc_v2_fn)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*pxn_getproc_v1_fn)(const char *, void **, int, uint64_t);
typedef CUresult (*pxn_init_fn)(unsigned int);
typedef CUresult (*pxn_version_fn)(int *);

/*
 * name: the entry point asked of cuGetProcAddress; version: the CUDA version
 * whose ABI we call (see docs/cuda.md); min_driver: the entry is asked for
 * only when the driver is at least this version, for entries whose ABI
 * changed under one name (asking a 12.8 driver for the 13.0 form would hand
 * back the 12.8 one).
 */
static const struct {
	const char *name;
	int version;
	int min_driver;
} pxn_cu_symbols[PXN_CU_NSYM] = {
	[PXN_cuGetErrorName] = {"cuGetErrorName", 6000, 0},
	[PXN_cuGetErrorString] = {"cuGetErrorString", 6000, 0},
	[PXN_cuDeviceGetCount] = {"cuDeviceGetCount", 2000, 0},
	[PXN_cuDeviceGet] = {"cuDeviceGet", 2000, 0},
	[PXN_cuDeviceGetAttribute] = {"cuDeviceGetAttribute", 2000, 0},
	[PXN_cuDeviceGetName] = {"cuDeviceGetName", 2000, 0},
	[PXN_cuDeviceGetPCIBusId] = {"cuDeviceGetPCIBusId", 4010, 0},
	[PXN_cuDeviceCanAccessPeer] = {"cuDeviceCanAccessPeer", 4000, 0},
	[PXN_cuDevicePrimaryCtxRetain] = {"cuDevicePrimaryCtxRetain", 7000, 0},
	[PXN_cuDevicePrimaryCtxRelease] = {"cuDevicePrimaryCtxRelease", 11000, 0},
	[PXN_cuCtxSetCurrent] = {"cuCtxSetCurrent", 4000, 0},
	[PXN_cuCtxGetCurrent] = {"cuCtxGetCurrent", 4000, 0},
	[PXN_cuCtxEnablePeerAccess] = {"cuCtxEnablePeerAccess", 4000, 0},
	[PXN_cuMemAlloc] = {"cuMemAlloc", 3020, 0},
	[PXN_cuMemFree] = {"cuMemFree", 3020, 0},
	[PXN_cuMemHostRegister] = {"cuMemHostRegister", 6050, 0},
	[PXN_cuMemHostUnregister] = {"cuMemHostUnregister", 4000, 0},
	[PXN_cuMemHostGetDevicePointer] = {"cuMemHostGetDevicePointer", 3020, 0},
	[PXN_cuMemcpyHtoD] = {"cuMemcpyHtoD", 3020, 0},
	[PXN_cuMemcpyDtoH] = {"cuMemcpyDtoH", 3020, 0},
	[PXN_cuMemsetD32Async] = {"cuMemsetD32Async", 3020, 0},
	[PXN_cuMemcpyAsync] = {"cuMemcpyAsync", 4000, 0},
	[PXN_cuMemcpyDtoDAsync] = {"cuMemcpyDtoDAsync", 3020, 0},
	[PXN_cuMemcpyPeerAsync] = {"cuMemcpyPeerAsync", 4000, 0},
	[PXN_cuMemcpyBatchAsync_v13000] = {"cuMemcpyBatchAsync", 13000, 13000},
	[PXN_cuMemcpyBatchAsync_v12080] = {"cuMemcpyBatchAsync", 12080, 12080},
	[PXN_cuStreamCreate] = {"cuStreamCreate", 2000, 0},
	[PXN_cuStreamDestroy] = {"cuStreamDestroy", 4000, 0},
	[PXN_cuStreamWaitEvent] = {"cuStreamWaitEvent", 3020, 0},
	[PXN_cuStreamSynchronize] = {"cuStreamSynchronize", 2000, 0},
	[PXN_cuStreamWriteValue64] = {"cuStreamWriteValue64", 12000, 0},
	[PXN_cuEventCreate] = {"cuEventCreate", 2000, 0},
	[PXN_cuEventRecord] = {"cuEventRecord", 2000, 0},
	[PXN_cuEventQuery] = {"cuEventQuery", 2000, 0},
	[PXN_cuEventSynchronize] = {"cuEventSynchronize", 2000, 0},
	[PXN_cuEventDestroy] = {"cuEventDestroy", 4000, 0},
	[PXN_cuIpcGetMemHandle] = {"cuIpcGetMemHandle", 4010, 0},
	[PXN_cuIpcOpenMemHandle] = {"cuIpcOpenMemHandle", 11000, 0},
	[PXN_cuIpcCloseMemHandle] = {"cuIpcCloseMemHandle", 4010, 0},
	[PXN_cuPointerGetAttribute] = {"cuPointerGetAttribute", 4000, 0},
	[PXN_cuModuleLoadData] = {"cuModuleLoadData", 2000, 0},
	[PXN_cuModuleGetFunction] = {"cuModuleGetFunction", 2000, 0},
	[PXN_cuModuleUnload] = {"cuModuleUnload", 2000, 0},
	[PXN_cuLaunchKernel] = {"cuLaunchKernel", 4000, 0},
	[PXN_cuMemGetInfo] = {"cuMemGetInfo", 3020, 0},
	[PXN_cuMemcpyHtoDAsync] = {"cuMemcpyHtoDAsync", 3020, 0},
	[PXN_cuCtxGetDevice] = {"cuCtxGetDevice", 2000, 0},
	[PXN_cuMemGetAllocationGranularity] = {"cuMemGetAllocationGranularity", 10020, 0},
	[PXN_cuMemCreate] = {"cuMemCreate", 10020, 0},
	[PXN_cuMemRelease] = {"cuMemRelease", 10020, 0},
	[PXN_cuMemAddressReserve] = {"cuMemAddressReserve", 10020, 0},
	[PXN_cuMemAddressFree] = {"cuMemAddressFree", 10020, 0},
	[PXN_cuMemMap] = {"cuMemMap", 10020, 0},
	[PXN_cuMemUnmap] = {"cuMemUnmap", 10020, 0},
	[PXN_cuMemSetAccess] = {"cuMemSetAccess", 10020, 0},
	[PXN_cuMemExportToShareableHandle] = {"cuMemExportToShareableHandle", 10020, 0},
	[PXN_cuMemImportFromShareableHandle] = {"cuMemImportFromShareableHandle", 10020, 0},
	[PXN_cuMemGetAllocationPropertiesFromHandle] = {"cuMemGetAllocationPropertiesFromHandle", 10020, 0},
	[PXN_cuPointerGetAttributes] = {"cuPointerGetAttributes", 7000, 0},
};

const char *pxn_cu_symbol_name(int i) { return (i >= 0 && i < PXN_CU_NSYM) ? pxn_cu_symbols[i].name : NULL; }
int pxn_cu_symbol_version(int i) { return (i >= 0 && i < PXN_CU_NSYM) ? pxn_cu_symbols[i].version : 0; }
int pxn_cu_symbol_min_driver(int i) { return (i >= 0 && i < PXN_CU_NSYM) ? pxn_cu_symbols[i].min_driver : 0; }

static void pxn_copy_dlerror(char *err, size_t errlen) {
	const char *e = dlerror();
	if (err == NULL || errlen == 0) {
		return;
	}
	if (e == NULL) {
		err[0] = 0;
		return;
	}
	strncpy(err, e, errlen - 1);
	err[errlen - 1] = 0;
}

int pxn_cu_load(pxn_cu_table *t, const char *libname, CUresult *res, char *err, size_t errlen) {
	memset(t, 0, sizeof(*t));
	*res = 0;
	if (err != NULL && errlen > 0) {
		err[0] = 0;
	}
	t->lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
	if (t->lib == NULL) {
		pxn_copy_dlerror(err, errlen);
		return -1;
	}
	/*
	 * Only these three come from dlsym: a plain exported name is the
	 * oldest ABI of an entry point, so everything else is asked of
	 * cuGetProcAddress at a pinned version.
	 */
	pxn_getproc_v2_fn getproc2 = (pxn_getproc_v2_fn)dlsym(t->lib, "cuGetProcAddress_v2");
	pxn_getproc_v1_fn getproc1 = NULL;
	if (getproc2 == NULL) {
		getproc1 = (pxn_getproc_v1_fn)dlsym(t->lib, "cuGetProcAddress");
	}
	pxn_version_fn version = (pxn_version_fn)dlsym(t->lib, "cuDriverGetVersion");
	pxn_init_fn init = (pxn_init_fn)dlsym(t->lib, "cuInit");
	if (getproc2 == NULL && getproc1 == NULL) {
		pxn_copy_dlerror(err, errlen);
		return -2;
	}
	if (version == NULL || init == NULL) {
		pxn_copy_dlerror(err, errlen);
		return -3;
	}
	t->proc_v2 = getproc2 != NULL;
	CUresult r = version(&t->driver_version);
	if (r != 0) {
		*res = r;
		return -4;
	}
	r = init(0);
	if (r != 0) {
		*res = r;
		/* The error names are still useful to the caller. */
		for (int i = PXN_cuGetErrorName; i <= PXN_cuGetErrorString; i++) {
			void *fp = NULL;
			int status = 0;
			if (getproc2 != NULL) {
				if (getproc2(pxn_cu_symbols[i].name, &fp, pxn_cu_symbols[i].version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != 0 || status != 0) {
					fp = NULL;
				}
			} else if (getproc1(pxn_cu_symbols[i].name, &fp, pxn_cu_symbols[i].version, CU_GET_PROC_ADDRESS_LEGACY_STREAM) != 0) {
				fp = NULL;
			}
			t->fn[i] = fp;
		}
		return -5;
	}
	for (int i = 0; i < PXN_CU_NSYM; i++) {
		void *fp = NULL;
		if (pxn_cu_symbols[i].min_driver > t->driver_version) {
			continue;
		}
		if (getproc2 != NULL) {
			int status = 0;
			if (getproc2(pxn_cu_symbols[i].name, &fp, pxn_cu_symbols[i].version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != 0 || status != 0) {
				fp = NULL;
			}
		} else if (getproc1(pxn_cu_symbols[i].name, &fp, pxn_cu_symbols[i].version, CU_GET_PROC_ADDRESS_LEGACY_STREAM) != 0) {
			fp = NULL;
		}
		t->fn[i] = fp;
	}
	return 0;
}

void pxn_cu_unload(pxn_cu_table *t) {
	/*
	 * libcuda is never dlclosed: other code of the process may hold it,
	 * and unloading a driver with live contexts is undefined.
	 */
	memset(t->fn, 0, sizeof(t->fn));
}

#define PXN_CALL(sym, sig, ...)                                  \
	do {                                                         \
		void *fp_ = t->fn[PXN_##sym];                            \
		if (fp_ == NULL) {                                       \
			return PXN_CU_NOT_AVAILABLE;                         \
		}                                                        \
		return ((CUresult(*) sig)fp_)(__VA_ARGS__);              \
	} while (0)

CUresult pxn_cuGetErrorName(pxn_cu_table *t, CUresult r, const char **s) {
	PXN_CALL(cuGetErrorName, (CUresult, const char **), r, s);
}
CUresult pxn_cuGetErrorString(pxn_cu_table *t, CUresult r, const char **s) {
	PXN_CALL(cuGetErrorString, (CUresult, const char **), r, s);
}
CUresult pxn_cuDeviceGetCount(pxn_cu_table *t, int *n) {
	PXN_CALL(cuDeviceGetCount, (int *), n);
}
CUresult pxn_cuDeviceGet(pxn_cu_table *t, CUdevice *d, int ordinal) {
	PXN_CALL(cuDeviceGet, (CUdevice *, int), d, ordinal);
}
CUresult pxn_cuDeviceGetAttribute(pxn_cu_table *t, int *v, int attr, CUdevice d) {
	PXN_CALL(cuDeviceGetAttribute, (int *, int, CUdevice), v, attr, d);
}
CUresult pxn_cuDeviceGetName(pxn_cu_table *t, char *name, int len, CUdevice d) {
	PXN_CALL(cuDeviceGetName, (char *, int, CUdevice), name, len, d);
}
CUresult pxn_cuDeviceGetPCIBusId(pxn_cu_table *t, char *id, int len, CUdevice d) {
	PXN_CALL(cuDeviceGetPCIBusId, (char *, int, CUdevice), id, len, d);
}
CUresult pxn_cuDeviceCanAccessPeer(pxn_cu_table *t, int *can, CUdevice d, CUdevice peer) {
	PXN_CALL(cuDeviceCanAccessPeer, (int *, CUdevice, CUdevice), can, d, peer);
}
CUresult pxn_cuDevicePrimaryCtxRetain(pxn_cu_table *t, pxn_handle *c, CUdevice d) {
	PXN_CALL(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice), (CUcontext *)c, d);
}
CUresult pxn_cuDevicePrimaryCtxRelease(pxn_cu_table *t, CUdevice d) {
	PXN_CALL(cuDevicePrimaryCtxRelease, (CUdevice), d);
}
CUresult pxn_cuCtxSetCurrent(pxn_cu_table *t, pxn_handle c) {
	PXN_CALL(cuCtxSetCurrent, (CUcontext), (CUcontext)c);
}
CUresult pxn_cuCtxGetCurrent(pxn_cu_table *t, pxn_handle *c) {
	PXN_CALL(cuCtxGetCurrent, (CUcontext *), (CUcontext *)c);
}

CUresult pxn_cuCtxGetDevice(pxn_cu_table *t, CUdevice *d) {
	PXN_CALL(cuCtxGetDevice, (CUdevice *), d);
}
CUresult pxn_cuCtxEnablePeerAccess(pxn_cu_table *t, pxn_handle peer, unsigned int flags) {
	PXN_CALL(cuCtxEnablePeerAccess, (CUcontext, unsigned int), (CUcontext)peer, flags);
}
CUresult pxn_cuMemAlloc(pxn_cu_table *t, CUdeviceptr *p, size_t n) {
	PXN_CALL(cuMemAlloc, (CUdeviceptr *, size_t), p, n);
}
CUresult pxn_cuMemFree(pxn_cu_table *t, CUdeviceptr p) {
	PXN_CALL(cuMemFree, (CUdeviceptr), p);
}
CUresult pxn_cuMemHostRegister(pxn_cu_table *t, uintptr_t p, size_t n, unsigned int flags) {
	PXN_CALL(cuMemHostRegister, (void *, size_t, unsigned int), (void *)p, n, flags);
}
CUresult pxn_cuMemHostUnregister(pxn_cu_table *t, uintptr_t p) {
	PXN_CALL(cuMemHostUnregister, (void *), (void *)p);
}
CUresult pxn_cuMemHostGetDevicePointer(pxn_cu_table *t, CUdeviceptr *d, uintptr_t p, unsigned int flags) {
	PXN_CALL(cuMemHostGetDevicePointer, (CUdeviceptr *, void *, unsigned int), d, (void *)p, flags);
}
CUresult pxn_cuMemcpyHtoD(pxn_cu_table *t, CUdeviceptr dst, const void *src, size_t n) {
	PXN_CALL(cuMemcpyHtoD, (CUdeviceptr, const void *, size_t), dst, src, n);
}
CUresult pxn_cuMemcpyDtoH(pxn_cu_table *t, void *dst, CUdeviceptr src, size_t n) {
	PXN_CALL(cuMemcpyDtoH, (void *, CUdeviceptr, size_t), dst, src, n);
}
CUresult pxn_cuMemsetD32Async(pxn_cu_table *t, CUdeviceptr dst, unsigned int v, size_t n, pxn_handle s) {
	PXN_CALL(cuMemsetD32Async, (CUdeviceptr, unsigned int, size_t, CUstream), dst, v, n, (CUstream)s);
}
CUresult pxn_cuMemcpyAsync(pxn_cu_table *t, CUdeviceptr dst, CUdeviceptr src, size_t n, pxn_handle s) {
	PXN_CALL(cuMemcpyAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream), dst, src, n, (CUstream)s);
}
CUresult pxn_cuMemcpyDtoDAsync(pxn_cu_table *t, CUdeviceptr dst, CUdeviceptr src, size_t n, pxn_handle s) {
	PXN_CALL(cuMemcpyDtoDAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream), dst, src, n, (CUstream)s);
}
CUresult pxn_cuMemcpyPeerAsync(pxn_cu_table *t, CUdeviceptr dst, pxn_handle dctx, CUdeviceptr src, pxn_handle sctx, size_t n, pxn_handle s) {
	PXN_CALL(cuMemcpyPeerAsync, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream), dst, (CUcontext)dctx, src, (CUcontext)sctx, n, (CUstream)s);
}
CUresult pxn_cuMemcpyBatchAsync_v13000(pxn_cu_table *t, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
	CUmemcpyAttributes *attrs, size_t *attrIdxs, size_t numAttrs, pxn_handle s) {
	PXN_CALL(cuMemcpyBatchAsync_v13000,
		(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t, CUstream),
		dsts, srcs, sizes, count, attrs, attrIdxs, numAttrs, (CUstream)s);
}
CUresult pxn_cuMemcpyBatchAsync_v12080(pxn_cu_table *t, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
	CUmemcpyAttributes *attrs, size_t *attrIdxs, size_t numAttrs, size_t *failIdx, pxn_handle s) {
	PXN_CALL(cuMemcpyBatchAsync_v12080,
		(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t, size_t *, CUstream),
		dsts, srcs, sizes, count, attrs, attrIdxs, numAttrs, failIdx, (CUstream)s);
}
CUresult pxn_cuStreamCreate(pxn_cu_table *t, pxn_handle *s, unsigned int flags) {
	PXN_CALL(cuStreamCreate, (CUstream *, unsigned int), (CUstream *)s, flags);
}
CUresult pxn_cuStreamDestroy(pxn_cu_table *t, pxn_handle s) {
	PXN_CALL(cuStreamDestroy, (CUstream), (CUstream)s);
}
CUresult pxn_cuStreamWaitEvent(pxn_cu_table *t, pxn_handle s, pxn_handle e, unsigned int flags) {
	PXN_CALL(cuStreamWaitEvent, (CUstream, CUevent, unsigned int), (CUstream)s, (CUevent)e, flags);
}
CUresult pxn_cuStreamSynchronize(pxn_cu_table *t, pxn_handle s) {
	PXN_CALL(cuStreamSynchronize, (CUstream), (CUstream)s);
}
CUresult pxn_cuStreamWriteValue64(pxn_cu_table *t, pxn_handle s, CUdeviceptr addr, uint64_t v, unsigned int flags) {
	PXN_CALL(cuStreamWriteValue64, (CUstream, CUdeviceptr, uint64_t, unsigned int), (CUstream)s, addr, v, flags);
}
CUresult pxn_cuEventCreate(pxn_cu_table *t, pxn_handle *e, unsigned int flags) {
	PXN_CALL(cuEventCreate, (CUevent *, unsigned int), (CUevent *)e, flags);
}
CUresult pxn_cuEventRecord(pxn_cu_table *t, pxn_handle e, pxn_handle s) {
	PXN_CALL(cuEventRecord, (CUevent, CUstream), (CUevent)e, (CUstream)s);
}
CUresult pxn_cuEventQuery(pxn_cu_table *t, pxn_handle e) {
	PXN_CALL(cuEventQuery, (CUevent), (CUevent)e);
}
CUresult pxn_cuEventSynchronize(pxn_cu_table *t, pxn_handle e) {
	PXN_CALL(cuEventSynchronize, (CUevent), (CUevent)e);
}
CUresult pxn_cuEventDestroy(pxn_cu_table *t, pxn_handle e) {
	PXN_CALL(cuEventDestroy, (CUevent), (CUevent)e);
}
CUresult pxn_cuIpcGetMemHandle(pxn_cu_table *t, CUipcMemHandle *h, CUdeviceptr p) {
	PXN_CALL(cuIpcGetMemHandle, (CUipcMemHandle *, CUdeviceptr), h, p);
}
CUresult pxn_cuIpcOpenMemHandle(pxn_cu_table *t, CUdeviceptr *p, const CUipcMemHandle *h, unsigned int flags) {
	PXN_CALL(cuIpcOpenMemHandle, (CUdeviceptr *, CUipcMemHandle, unsigned int), p, *h, flags);
}
CUresult pxn_cuIpcCloseMemHandle(pxn_cu_table *t, CUdeviceptr p) {
	PXN_CALL(cuIpcCloseMemHandle, (CUdeviceptr), p);
}
CUresult pxn_cuPointerGetAttribute(pxn_cu_table *t, void *data, int attr, CUdeviceptr p) {
	PXN_CALL(cuPointerGetAttribute, (void *, int, CUdeviceptr), data, attr, p);
}
CUresult pxn_cuPointerGetAttributes(pxn_cu_table *t, unsigned int n, int *attrs, void **data, CUdeviceptr p) {
	PXN_CALL(cuPointerGetAttributes, (unsigned int, int *, void **, CUdeviceptr), n, attrs, data, p);
}
CUresult pxn_cuModuleLoadData(pxn_cu_table *t, pxn_handle *m, const void *image) {
	PXN_CALL(cuModuleLoadData, (CUmodule *, const void *), (CUmodule *)m, image);
}
CUresult pxn_cuModuleGetFunction(pxn_cu_table *t, pxn_handle *f, pxn_handle m, const char *name) {
	PXN_CALL(cuModuleGetFunction, (CUfunction *, CUmodule, const char *), (CUfunction *)f, (CUmodule)m, name);
}
CUresult pxn_cuModuleUnload(pxn_cu_table *t, pxn_handle m) {
	PXN_CALL(cuModuleUnload, (CUmodule), (CUmodule)m);
}

CUresult pxn_cuMemGetInfo(pxn_cu_table *t, size_t *free_bytes, size_t *total_bytes) {
	PXN_CALL(cuMemGetInfo, (size_t *, size_t *), free_bytes, total_bytes);
}
CUresult pxn_cuMemcpyHtoDAsync(pxn_cu_table *t, CUdeviceptr dst, uintptr_t src, size_t n, pxn_handle s) {
	PXN_CALL(cuMemcpyHtoDAsync, (CUdeviceptr, const void *, size_t, CUstream), dst, (const void *)src, n, (CUstream)s);
}

/* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
#define PXN_CU_MEM_HANDLE_TYPE_POSIX_FD 1

CUresult pxn_cuMemGetAllocationGranularity(pxn_cu_table *t, size_t *g, const CUmemAllocationProp *prop, int option) {
	PXN_CALL(cuMemGetAllocationGranularity, (size_t *, const CUmemAllocationProp *, int), g, prop, option);
}
CUresult pxn_cuMemCreate(pxn_cu_table *t, CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop) {
	PXN_CALL(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long), h, size, prop, 0ULL);
}
CUresult pxn_cuMemRelease(pxn_cu_table *t, CUmemGenericAllocationHandle h) {
	PXN_CALL(cuMemRelease, (CUmemGenericAllocationHandle), h);
}
CUresult pxn_cuMemAddressReserve(pxn_cu_table *t, CUdeviceptr *p, size_t size, size_t align) {
	PXN_CALL(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long), p, size, align, (CUdeviceptr)0, 0ULL);
}
CUresult pxn_cuMemAddressFree(pxn_cu_table *t, CUdeviceptr p, size_t size) {
	PXN_CALL(cuMemAddressFree, (CUdeviceptr, size_t), p, size);
}
CUresult pxn_cuMemMap(pxn_cu_table *t, CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h) {
	PXN_CALL(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long), p, size, offset, h, 0ULL);
}
CUresult pxn_cuMemUnmap(pxn_cu_table *t, CUdeviceptr p, size_t size) {
	PXN_CALL(cuMemUnmap, (CUdeviceptr, size_t), p, size);
}
CUresult pxn_cuMemSetAccess(pxn_cu_table *t, CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count) {
	PXN_CALL(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t), p, size, desc, count);
}
CUresult pxn_cuMemExportToShareableHandleFD(pxn_cu_table *t, int *fd, CUmemGenericAllocationHandle h) {
	PXN_CALL(cuMemExportToShareableHandle, (void *, CUmemGenericAllocationHandle, int, unsigned long long), (void *)fd, h,
		PXN_CU_MEM_HANDLE_TYPE_POSIX_FD, 0ULL);
}
CUresult pxn_cuMemImportFromShareableHandleFD(pxn_cu_table *t, CUmemGenericAllocationHandle *h, int fd) {
	/* A POSIX descriptor is passed as the pointer-sized value itself. */
	PXN_CALL(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *, void *, int), h, (void *)(intptr_t)fd,
		PXN_CU_MEM_HANDLE_TYPE_POSIX_FD);
}
CUresult pxn_cuMemGetAllocationPropertiesFromHandle(pxn_cu_table *t, CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
	PXN_CALL(cuMemGetAllocationPropertiesFromHandle, (CUmemAllocationProp *, CUmemGenericAllocationHandle), prop, h);
}

#define PXN_MAX_KERNEL_ARGS 32

CUresult pxn_cuLaunchKernel(pxn_cu_table *t, pxn_handle f, unsigned int gx, unsigned int gy, unsigned int gz,
	unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, pxn_handle s,
	const uint64_t *args, int nargs) {
	void *params[PXN_MAX_KERNEL_ARGS];
	if (nargs < 0 || nargs > PXN_MAX_KERNEL_ARGS) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (int i = 0; i < nargs; i++) {
		params[i] = (void *)&args[i];
	}
	PXN_CALL(cuLaunchKernel,
		(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
			unsigned int, CUstream, void **, void **),
		(CUfunction)f, gx, gy, gz, bx, by, bz, shmem, (CUstream)s, nargs > 0 ? params : NULL, NULL);
}

/*
 * ctx_enter makes ctx current and remembers what was; ctx_leave puts it
 * back, so a call on a caller's thread leaves that thread as it found it.
 */
static CUresult ctx_enter(pxn_cu_table *t, pxn_handle ctx, pxn_handle *prev) {
	*prev = ctx;
	if (ctx == 0) {
		return 0;
	}
	pxn_handle cur = 0;
	CUresult r = pxn_cuCtxGetCurrent(t, &cur);
	if (r != 0) {
		return r;
	}
	*prev = cur;
	if (cur == ctx) {
		return 0;
	}
	return pxn_cuCtxSetCurrent(t, ctx);
}

static void ctx_leave(pxn_cu_table *t, pxn_handle ctx, pxn_handle prev) {
	if (prev != ctx) {
		pxn_cuCtxSetCurrent(t, prev);
	}
}

CUresult pxn_ensure_ctx(pxn_cu_table *t, pxn_handle ctx) {
	pxn_handle prev;
	return ctx_enter(t, ctx, &prev);
}

CUresult pxn_record_event(pxn_cu_table *t, pxn_handle ctx, pxn_handle e, pxn_handle s) {
	pxn_handle prev;
	CUresult r = ctx_enter(t, ctx, &prev);
	if (r != 0) {
		return r;
	}
	r = pxn_cuEventRecord(t, e, s == 0 ? PXN_CU_STREAM_LEGACY : s);
	ctx_leave(t, ctx, prev);
	return r;
}

CUresult pxn_query_event(pxn_cu_table *t, pxn_handle ctx, pxn_handle e) {
	pxn_handle prev;
	CUresult r = ctx_enter(t, ctx, &prev);
	if (r != 0) {
		return r;
	}
	r = pxn_cuEventQuery(t, e);
	ctx_leave(t, ctx, prev);
	return r;
}

pxn_copy_scratch *pxn_scratch_new(size_t cap) {
	pxn_copy_scratch *s = calloc(1, sizeof(*s));
	if (s == NULL) {
		return NULL;
	}
	s->cap = cap;
	s->dsts = calloc(cap, sizeof(CUdeviceptr));
	s->srcs = calloc(cap, sizeof(CUdeviceptr));
	s->sizes = calloc(cap, sizeof(size_t));
	s->inline_plan = calloc(1, sizeof(pxn_inline_plan));
	if (s->dsts == NULL || s->srcs == NULL || s->sizes == NULL || s->inline_plan == NULL) {
		pxn_scratch_free(s);
		return NULL;
	}
	return s;
}

void pxn_scratch_free(pxn_copy_scratch *s) {
	if (s == NULL) {
		return;
	}
	free(s->dsts);
	free(s->srcs);
	free(s->sizes);
	free(s->inline_plan);
	free(s);
}

static CUresult enqueue_copies(pxn_cu_table *t, pxn_piece_op *op, const pxn_copy_entry *entries, size_t n) {
	CUresult r;
	size_t live = 0;
	for (size_t i = 0; i < n; i++) {
		if (entries[i].len != 0) {
			live++;
		}
	}
	if (live == 0) {
		return 0;
	}
	if (op->mode == PXN_COPY_PER_ENTRY || live == 1) {
		for (size_t i = 0; i < n; i++) {
			const pxn_copy_entry *e = &entries[i];
			if (e->len == 0) {
				continue;
			}
			r = pxn_cuMemcpyAsync(t, e->dst, e->src, e->len, op->stream);
			if (r != 0) {
				op->fail_idx = i;
				return r;
			}
		}
		return 0;
	}
	pxn_copy_scratch *s = op->scratch;
	if (s == NULL || live > s->cap) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const pxn_copy_entry *e = &entries[i];
		if (e->len == 0) {
			continue;
		}
		s->dsts[k] = e->dst;
		s->srcs[k] = e->src;
		s->sizes[k] = e->len;
		k++;
	}
	CUmemcpyAttributes attr;
	memset(&attr, 0, sizeof(attr));
	attr.srcAccessOrder = PXN_CU_SRC_ACCESS_ORDER_STREAM;
	size_t attr_idx = 0;
	switch (op->mode) {
	case PXN_COPY_BATCH_V13000:
		return pxn_cuMemcpyBatchAsync_v13000(t, s->dsts, s->srcs, s->sizes, k, &attr, &attr_idx, 1, op->stream);
	case PXN_COPY_BATCH_V12080: {
		size_t fail = (size_t)-1;
		r = pxn_cuMemcpyBatchAsync_v12080(t, s->dsts, s->srcs, s->sizes, k, &attr, &attr_idx, 1, &fail, op->stream);
		op->fail_idx = fail;
		return r;
	}
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

size_t pxn_plan_bytes(size_t n) { return n * sizeof(pxn_copy_entry) + (n + 1) * sizeof(uint64_t) + PXN_GATHER_MAX_PARTS * sizeof(uint64_t); }

_Static_assert(offsetof(pxn_inline_plan, cuts) == 32, "pxn_inline_plan.cuts");
_Static_assert(offsetof(pxn_inline_plan, entries) == 96, "pxn_inline_plan.entries");
_Static_assert(offsetof(pxn_inline_plan, prefix) == 96 + 24 * PXN_INLINE_ENTRIES, "pxn_inline_plan.prefix");
_Static_assert(offsetof(pxn_inline_plan, bell) == 96 + 32 * PXN_INLINE_ENTRIES + 8, "pxn_inline_plan.bell");
_Static_assert(sizeof(pxn_inline_plan) == 96 + 32 * PXN_INLINE_ENTRIES + 16, "sizeof pxn_inline_plan");

/* kernel_bell_of: the doorbell a gather kernel rings itself, or 0. */
static CUdeviceptr kernel_bell_of(const pxn_piece_op *op) { return op->doorbell != 0 && op->arrived != 0 ? op->doorbell : 0; }

/*
 * set_parts writes the Piece's part cuts (total bytes in all) into cuts and
 * returns how many parts there are, or 0 when op's cuts are not valid.
 */
static unsigned int set_parts(const pxn_piece_op *op, uint64_t total, uint64_t *cuts) {
	if (op->nparts <= 1) {
		cuts[0] = total;
		return 1;
	}
	if (op->nparts > PXN_GATHER_MAX_PARTS || op->cuts[op->nparts - 1] != total) {
		return 0;
	}
	for (unsigned int p = 0; p < op->nparts; p++) {
		if (op->cuts[p] == 0 || (p > 0 && op->cuts[p] <= op->cuts[p - 1])) {
			return 0;
		}
		cuts[p] = op->cuts[p];
	}
	return op->nparts;
}

/* launch_inline launches the inline gather kernel with ip as its parameter. */
static CUresult launch_inline(pxn_cu_table *t, const pxn_piece_op *op, pxn_inline_plan *ip) {
	void *params[1] = {ip};
	PXN_CALL(cuLaunchKernel,
		(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
			unsigned int, CUstream, void **, void **),
		(CUfunction)op->gather_inline, op->grid, 1, 1, op->block, 1, 1, 0, (CUstream)op->stream, params, NULL);
}

/*
 * The inline path: a plan of at most PXN_INLINE_ENTRIES non-empty entries
 * goes to the kernel as its parameter, copied by the launch itself, so the
 * launch waits for no upload and leaves no staging to guard.
 */
static CUresult enqueue_gather_inline(pxn_cu_table *t, pxn_piece_op *op, const pxn_copy_entry *entries, size_t n) {
	pxn_inline_plan *ip = op->scratch->inline_plan;
	size_t k = 0;
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++) {
		if (entries[i].len == 0) {
			continue;
		}
		ip->entries[k] = entries[i];
		ip->prefix[k] = total;
		total += entries[i].len;
		k++;
	}
	if (k == 0) {
		return 0;
	}
	ip->prefix[k] = total;
	unsigned int parts = set_parts(op, total, ip->cuts);
	if (parts == 0) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	ip->n = (uint32_t)k;
	ip->parts = parts;
	ip->words = parts > 1 ? op->part_words : 0;
	ip->seq = op->seq;
	ip->arrived = op->arrived;
	ip->bell = kernel_bell_of(op);
	op->stage = PXN_STAGE_LAUNCH;
	CUresult r = launch_inline(t, op, ip);
	op->kernel_bell = r == 0 && ip->bell != 0;
	return r;
}

/*
 * The gather path: the Piece's non-empty entries and their prefix sums are
 * written to pinned staging and uploaded on the upload stream, which does not
 * wait for the source (the plan is host data), so the upload of the next
 * Piece overlaps the kernel of this one; the stream waits for the upload and
 * one kernel launch copies the entries.
 */
static CUresult enqueue_gather(pxn_cu_table *t, pxn_piece_op *op, const pxn_copy_entry *entries, size_t n) {
	pxn_copy_entry *plan = (pxn_copy_entry *)op->plan_host;
	/* plan_host is a uintptr_t: Go hands over C-side memory as an integer. */
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (entries[i].len == 0) {
			continue;
		}
		if (k == op->plan_cap) {
			op->fail_idx = i;
			return CUDA_ERROR_INVALID_VALUE;
		}
		plan[k++] = entries[i];
	}
	if (k == 0) {
		return 0;
	}
	uint64_t *prefix = (uint64_t *)(plan + k);
	uint64_t total = 0;
	for (size_t i = 0; i < k; i++) {
		prefix[i] = total;
		total += plan[i].len;
	}
	prefix[k] = total;
	/* The parts' cuts follow the prefix sums. */
	uint64_t *cuts = prefix + k + 1;
	unsigned int parts = set_parts(op, total, cuts);
	if (parts == 0) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	size_t bytes = (size_t)((uintptr_t)(cuts + parts) - (uintptr_t)plan);
	CUresult r = pxn_cuMemcpyHtoDAsync(t, op->plan_dev, op->plan_host, bytes, op->upload);
	if (r != 0) {
		return r;
	}
	if ((r = pxn_cuEventRecord(t, op->plan_up, op->upload)) != 0) {
		return r;
	}
	if ((r = pxn_cuStreamWaitEvent(t, op->stream, op->plan_up, 0)) != 0) {
		return r;
	}
	op->stage = PXN_STAGE_LAUNCH;
	CUdeviceptr prefix_dev = op->plan_dev + k * sizeof(pxn_copy_entry);
	CUdeviceptr cuts_dev = prefix_dev + (k + 1) * sizeof(uint64_t);
	uint64_t args[9] = {op->plan_dev, prefix_dev, k, cuts_dev, parts, op->arrived, parts > 1 ? op->part_words : 0, op->seq, kernel_bell_of(op)};
	r = pxn_cuLaunchKernel(t, op->gather_fn, op->grid, 1, 1, op->block, 1, 1, 0, op->stream, args, 9);
	if (r != 0) {
		return r;
	}
	op->kernel_bell = args[8] != 0;
	op->stage = PXN_STAGE_PLAN;
	return pxn_cuEventRecord(t, op->plan_busy, op->stream);
}

CUresult pxn_enqueue_piece(pxn_cu_table *t, pxn_piece_op *op, const pxn_copy_entry *entries, size_t n) {
	pxn_handle prev;
	CUresult r;
	op->stage = PXN_STAGE_CONTEXT;
	op->fail_idx = (size_t)-1;
	op->kernel_bell = 0;
	r = ctx_enter(t, op->ctx, &prev);
	if (r != 0) {
		return r;
	}
	/* A plan that fits the inline kernel's parameter needs no staging. */
	int inline_plan = op->mode == PXN_COPY_GATHER && op->gather_inline != 0 && n <= PXN_INLINE_ENTRIES;
	if (op->mode == PXN_COPY_GATHER) {
		op->stage = PXN_STAGE_PLAN;
		if (op->nparts > 1 && (op->arrived == 0 || op->part_words == 0)) {
			r = CUDA_ERROR_INVALID_VALUE;
			goto out;
		}
	}
	if (op->mode == PXN_COPY_GATHER && !inline_plan) {
		/* The staging is rewritten below: its last upload must be done. */
		if (op->gather_fn == 0 || op->plan_host == 0 || op->plan_dev == 0 || op->upload == 0 || op->plan_up == 0 || op->plan_busy == 0) {
			r = CUDA_ERROR_INVALID_VALUE;
			goto out;
		}
		r = pxn_cuEventQuery(t, op->plan_busy);
		if (r != 0) {
			goto out;
		}
	}
	if (op->wait != 0) {
		op->stage = PXN_STAGE_WAIT;
		r = pxn_cuStreamWaitEvent(t, op->stream, op->wait, 0);
		if (r != 0) {
			goto out;
		}
	}
	op->stage = PXN_STAGE_COPY;
	if (inline_plan) {
		r = enqueue_gather_inline(t, op, entries, n);
	} else if (op->mode == PXN_COPY_GATHER) {
		r = enqueue_gather(t, op, entries, n);
	} else {
		r = enqueue_copies(t, op, entries, n);
	}
	if (r != 0) {
		goto out;
	}
	if (op->doorbell != 0 && !op->kernel_bell) {
		op->stage = PXN_STAGE_DOORBELL;
		/* Flags 0: the write follows a memory barrier over the copies. */
		r = pxn_cuStreamWriteValue64(t, op->stream, op->doorbell, op->seq, 0);
		if (r != 0) {
			goto out;
		}
	}
	if (op->done != 0) {
		op->stage = PXN_STAGE_RECORD;
		r = pxn_cuEventRecord(t, op->done, op->stream);
		if (r != 0) {
			goto out;
		}
	}
	op->stage = 0;
out:
	ctx_leave(t, op->ctx, prev);
	return r;
}

int pxn_classify(pxn_cu_table *t, pxn_handle ctx, CUdeviceptr p, uint64_t n) {
	return pxn_classify_range(t, ctx, p, n).kind;
}

/*
 * pointer_range reads p's memory type and allocation range: in one
 * cuPointerGetAttributes where the driver has it (7.0 and later; for a
 * pointer it does not know it succeeds with every value zero), else in one
 * cuPointerGetAttribute each. 0 when all three were read.
 */
static CUresult pointer_range(pxn_cu_table *t, CUdeviceptr p, unsigned int *type, CUdeviceptr *start, size_t *size) {
	if (t->fn[PXN_cuPointerGetAttributes] != NULL) {
		int attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
		void *data[3] = {type, start, size};
		return pxn_cuPointerGetAttributes(t, 3, attrs, data, p);
	}
	CUresult r = pxn_cuPointerGetAttribute(t, type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
	if (r != 0 || *type != CU_MEMORYTYPE_DEVICE) {
		return r;
	}
	r = pxn_cuPointerGetAttribute(t, start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
	if (r != 0) {
		return r;
	}
	return pxn_cuPointerGetAttribute(t, size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
}

pxn_range_class pxn_classify_range(pxn_cu_table *t, pxn_handle ctx, CUdeviceptr p, uint64_t n) {
	pxn_range_class c = {1, 0, 0};
	pxn_handle prev;
	if (p == 0) {
		return c;
	}
	if (ctx_enter(t, ctx, &prev) != 0) {
		return c;
	}
	unsigned int type = 0;
	CUdeviceptr start = 0;
	size_t size = 0;
	if (pointer_range(t, p, &type, &start, &size) != 0 || type != CU_MEMORYTYPE_DEVICE || size == 0) {
		goto out;
	}
	if (p < start || p - start >= size || (n > 0 && (p + n < p || p + n > start + size))) {
		goto out;
	}
	c.kind = 2;
	c.start = start;
	c.size = size;
out:
	ctx_leave(t, ctx, prev);
	return c;
}
