// SPDX-License-Identifier: Apache-2.0

// firsthop: what a first hop of a few hundred KV blocks costs with each way
// of starting the copy, measured with the project's gather kernel
// (pkg/gpu/kernel/gather.cu, included below) on one GPU. It weighs the
// designs of docs/cuda.md "Starting the first hop":
//
//   launch-wv     a launch per slot with the plan as its parameter, then
//                 cuStreamWriteValue64 of the doorbell (the copier today)
//   launch-bell   the same launch; the kernel rings the doorbell itself
//                 (gather_parts' bell: the last warp to finish stores it)
//   graph-bell    that kernel as the one node of a CUDA graph, its
//                 parameter replaced per slot (cudaGraphExecKernelNodeSetParams)
//   persist       a resident kernel of a few blocks that polls a ring of
//                 plans in pinned host memory (__nanosleep between polls),
//                 copies each slot and rings its doorbell; it exits after
//                 an idle time and is launched again on the next slot
//   persist-cold  the first slot after it exited: a launch and the slot
//
// For each shape (entries x bytes, sources scattered, the slot
// contiguous) and each way: latency with one slot in flight (p50, p99, max
// from the host's post to the host seeing the doorbell) and rate with
// eight in flight. PROCS processes run every cell at once (fork before any
// CUDA call; under MPS they share the GPU as serving ranks do). Then the
// idle cost: a compute-bound kernel's time alone and beside an idle
// resident copier.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 firsthop.cu -o firsthop -lcuda
//   ./firsthop [PROCS...]          (default: 1 8)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../pkg/gpu/kernel/gather.cu"

#define PXN_GATHER_MAX_PARTS 8

#define CHECK(x)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (x);                                                              \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
			exit(2);                                                                   \
		}                                                                                  \
	} while (0)
#define CHECKDRV(x)                                                                  \
	do {                                                                         \
		CUresult r_ = (x);                                                   \
		if (r_ != CUDA_SUCCESS) {                                            \
			const char *s_ = "?";                                        \
			cuGetErrorString(r_, &s_);                                   \
			fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); \
			exit(2);                                                     \
		}                                                                    \
	} while (0)

typedef unsigned long long u64;

constexpr int kRing = 16;
constexpr int kDepth = 8;
constexpr int kLatIters = 400;
constexpr int kRateSlots = 800;
constexpr u64 kStop = ~0ULL;

// One slot's work as the persistent kernel reads it from pinned host memory.
struct ring_slot {
	volatile u64 seq;
	unsigned int n;
	unsigned int pad;
	pxn_entry entries[PXN_INLINE_ENTRIES];
	u64 prefix[PXN_INLINE_ENTRIES + 1];
};

// ring_bell: after every block of the grid is done with the slot, the last
// one resets the slot's counter and stores seq into the host doorbell (the
// resident kernel's own; a launch uses gather_parts' doorbell).
static __device__ __forceinline__ void ring_bell(unsigned int *counter, volatile u64 *bell, u64 seq)
{
	__syncthreads();
	if (threadIdx.x == 0) {
		__threadfence_system();
		if (atomicAdd(counter, 1u) == gridDim.x - 1u) {
			atomicExch(counter, 0u);
			__threadfence_system();
			*bell = seq;
		}
	}
}

static __device__ __forceinline__ u64 globaltimer()
{
	u64 t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

extern "C" __global__ void __launch_bounds__(1024) probe_persist(ring_slot *ring, unsigned int *counters, u64 *bells, u64 first, u64 idle_ns,
	unsigned int *exits, u64 *exited)
{
	__shared__ pxn_entry ent[PXN_INLINE_ENTRIES];
	__shared__ u64 pre[PXN_INLINE_ENTRIES + 1];
	__shared__ int cmd;
	__shared__ unsigned int sn;
	const unsigned int lane = threadIdx.x & 31u;
	const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
	u64 next = first;
	for (;;) {
		ring_slot *s = &ring[next % kRing];
		if (threadIdx.x == 0) {
			const u64 t0 = globaltimer();
			unsigned int ns = 64;
			for (;;) {
				const u64 v = s->seq;
				if (v == next) {
					cmd = 1;
					break;
				}
				if (v == kStop || globaltimer() - t0 > idle_ns) {
					cmd = 0;
					break;
				}
				__nanosleep(ns);
				if (ns < 1024) {
					ns *= 2;
				}
			}
			__threadfence_system();
			sn = cmd ? s->n : 0;
		}
		__syncthreads();
		if (!cmd) {
			break;
		}
		const unsigned int n = sn;
		for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) {
			ent[i] = s->entries[i];
		}
		for (unsigned int i = threadIdx.x; i <= n; i += blockDim.x) {
			pre[i] = s->prefix[i];
		}
		__syncthreads();
		copy_bytes(ent, pre, n, 0, pre[n], warp, warps, lane);
		ring_bell(&counters[next % kRing], (volatile u64 *)&bells[next % kRing], next);
		next++;
	}
	if (threadIdx.x == 0) {
		__threadfence_system();
		if (atomicAdd(exits, 1u) == gridDim.x - 1u) {
			atomicExch(exits, 0u);
			__threadfence_system();
			*(volatile u64 *)exited = next - 1;
		}
	}
}

extern "C" __global__ void burn(float *out, int iters)
{
	float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f;
	for (int i = 0; i < iters; i++) {
		a = fmaf(a, b, c);
		b = fmaf(b, c, a * 1e-7f);
	}
	out[blockIdx.x * blockDim.x + threadIdx.x] = a + b;
}

static u64 now_ns()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (u64)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

struct shape {
	unsigned int n;
	u64 size;
};
static const shape kShapes[] = {{1, 10240}, {64, 4096}, {256, 2048}, {512, 2048}, {256, 3000}};
static const int kNShapes = sizeof kShapes / sizeof kShapes[0];
enum { LAUNCH_WV, LAUNCH_BELL, GRAPH_BELL, PERSIST, PERSIST_COLD, NMECH };
static const char *kMech[] = {"launch-wv", "launch-bell", "graph-bell", "persist", "persist-cold"};

// One process's figures for a cell.
struct cell {
	double p50, p99, max, gbps;
	int ok;
};
struct shared_results {
	pthread_barrier_t barrier;
	cell cells[16][kNShapes][NMECH];
	double burn_alone, burn_beside[2];
	int failed;
};

struct rank {
	int id;
	shared_results *res;
	cudaStream_t st[2];
	char *src, *dst;
	u64 src_len, dst_len;
	ring_slot *ring, *ring_d;
	u64 *bells, *bells_d;
	unsigned int *counters;
	u64 *exited, *exited_d;
	unsigned int *exits;
	pxn_inline_plan *plan;
	u64 seq;
	int graph_ready;
	cudaGraph_t graph;
	cudaGraphExec_t gexec;
	cudaGraphNode_t gnode;
	int persist_blocks;
	int persist_up;
};

static void make_plan(rank *r, const shape &sh, u64 seq)
{
	pxn_inline_plan *p = r->plan;
	const u64 total = sh.n * sh.size;
	const u64 dst = (u64)r->dst + (seq % kRing) * total;
	u64 off = 0;
	for (unsigned int i = 0; i < sh.n; i++) {
		// Sources scattered: every other block of the KV buffer.
		p->entries[i].src = (u64)r->src + (u64)i * 2 * ((sh.size + 255) & ~255ULL);
		p->entries[i].dst = dst + off;
		p->entries[i].len = sh.size;
		p->prefix[i] = off;
		off += sh.size;
	}
	p->prefix[sh.n] = off;
	p->n = sh.n;
	p->parts = 1;
	p->cuts[0] = off;
	p->seq = seq;
	p->words = 0;
	p->arrived = 0;
	p->bell = 0;
}

static void wait_bell(rank *r, u64 seq)
{
	volatile u64 *b = &r->bells[seq % kRing];
	while (*b != seq) {
	}
}

// post starts slot seq with mechanism m.
static void post(rank *r, int m, const shape &sh, u64 seq)
{
	make_plan(r, sh, seq);
	cudaStream_t st = r->st[seq & 1];
	switch (m) {
	case LAUNCH_WV: {
		void *args[] = {r->plan};
		CHECK(cudaLaunchKernel((const void *)pxn_gather_inline, dim3(8), dim3(1024), args, 0, st));
		CHECKDRV(cuStreamWriteValue64((CUstream)st, (CUdeviceptr)&r->bells_d[seq % kRing], seq, 0));
		break;
	}
	case LAUNCH_BELL: {
		r->plan->arrived = &r->counters[kRing + PXN_GATHER_MAX_PARTS * (seq % kRing)];
		r->plan->bell = &r->bells_d[seq % kRing];
		void *args[] = {r->plan};
		CHECK(cudaLaunchKernel((const void *)pxn_gather_inline, dim3(8), dim3(1024), args, 0, st));
		break;
	}
	case GRAPH_BELL: {
		r->plan->arrived = &r->counters[kRing + PXN_GATHER_MAX_PARTS * (seq % kRing)];
		r->plan->bell = &r->bells_d[seq % kRing];
		void *args[] = {r->plan};
		cudaKernelNodeParams kp = {};
		kp.func = (void *)pxn_gather_inline;
		kp.gridDim = dim3(8);
		kp.blockDim = dim3(1024);
		kp.kernelParams = args;
		if (!r->graph_ready) {
			CHECK(cudaGraphCreate(&r->graph, 0));
			CHECK(cudaGraphAddKernelNode(&r->gnode, r->graph, 0, 0, &kp));
			CHECK(cudaGraphInstantiate(&r->gexec, r->graph, 0));
			r->graph_ready = 1;
		} else {
			CHECK(cudaGraphExecKernelNodeSetParams(r->gexec, r->gnode, &kp));
		}
		CHECK(cudaGraphLaunch(r->gexec, st));
		break;
	}
	case PERSIST:
	case PERSIST_COLD: {
		ring_slot *s = &r->ring[seq % kRing];
		memcpy(s->entries, r->plan->entries, sh.n * sizeof(pxn_entry));
		memcpy(s->prefix, r->plan->prefix, (sh.n + 1) * sizeof(u64));
		s->n = sh.n;
		if (!r->persist_up || m == PERSIST_COLD) {
			if (r->persist_up) {
				// Cold: wait until the running kernel has gone idle and exited.
				while (*(volatile u64 *)r->exited != seq - 1) {
				}
			}
			u64 idle = m == PERSIST_COLD ? 20000ULL : 60000000000ULL;
			void *args[] = {&r->ring_d, &r->counters, &r->bells_d, &seq, &idle, &r->exits, &r->exited_d};
			CHECK(cudaLaunchKernel((const void *)probe_persist, dim3(r->persist_blocks), dim3(1024), args, 0, r->st[0]));
			r->persist_up = 1;
		}
		__atomic_store_n((u64 *)&s->seq, seq, __ATOMIC_RELEASE);
		break;
	}
	}
}

static void persist_stop(rank *r)
{
	if (!r->persist_up) {
		return;
	}
	// The kernel waits on the slot of the next seq.
	ring_slot *s = &r->ring[(r->seq + 1) % kRing];
	__atomic_store_n((u64 *)&s->seq, kStop, __ATOMIC_RELEASE);
	CHECK(cudaStreamSynchronize(r->st[0]));
	r->persist_up = 0;
	// The stop word must not be taken for a slot later.
	s->seq = 0;
}

static double pct(std::vector<double> &v, double q)
{
	std::sort(v.begin(), v.end());
	size_t i = (size_t)(q * (v.size() - 1) + 0.5);
	return v[i];
}

static int verify(rank *r, const shape &sh, u64 seq)
{
	make_plan(r, sh, seq);
	std::vector<char> a(sh.size), b(sh.size);
	for (unsigned int i = 0; i < sh.n; i += (sh.n > 8 ? sh.n / 8 : 1)) {
		CHECK(cudaMemcpy(a.data(), (void *)r->plan->entries[i].src, sh.size, cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(b.data(), (void *)r->plan->entries[i].dst, sh.size, cudaMemcpyDeviceToHost));
		if (memcmp(a.data(), b.data(), sh.size) != 0) {
			return 0;
		}
	}
	return 1;
}

static void run_cell(rank *r, int shi, int m)
{
	const shape &sh = kShapes[shi];
	cell &c = r->res->cells[r->id][shi][m];
	std::vector<double> lat;
	pthread_barrier_wait(&r->res->barrier);
	CHECK(cudaMemset(r->dst, 0, r->dst_len));
	CHECK(cudaDeviceSynchronize());
	for (int i = 0; i < kLatIters; i++) {
		const u64 seq = ++r->seq;
		if (m == PERSIST_COLD) {
			// Past the kernel's idle time, so that it has exited.
			usleep(200);
		}
		const u64 t0 = now_ns();
		post(r, m, sh, seq);
		wait_bell(r, seq);
		lat.push_back((now_ns() - t0) / 1000.0);
	}
	c.ok = verify(r, sh, r->seq);
	c.p50 = pct(lat, 0.5);
	c.p99 = pct(lat, 0.99);
	c.max = lat.back();
	if (m == PERSIST_COLD) {
		while (*(volatile u64 *)r->exited != r->seq) {
		}
		CHECK(cudaStreamSynchronize(r->st[0]));
		r->persist_up = 0;
		c.gbps = 0;
		return;
	}
	pthread_barrier_wait(&r->res->barrier);
	const u64 first = r->seq + 1;
	const u64 t0 = now_ns();
	for (int i = 0; i < kRateSlots; i++) {
		const u64 seq = ++r->seq;
		if (seq >= first + kDepth) {
			wait_bell(r, seq - kDepth);
		}
		post(r, m, sh, seq);
	}
	for (u64 s = r->seq + 1 > kDepth ? r->seq + 1 - kDepth : first; s <= r->seq; s++) {
		if (s >= first) {
			wait_bell(r, s);
		}
	}
	c.gbps = (double)kRateSlots * sh.n * sh.size / (now_ns() - t0);
	c.ok = c.ok && verify(r, sh, r->seq);
	if (m == PERSIST) {
		persist_stop(r);
	}
}

static void rank_setup(rank *r, int id, shared_results *res)
{
	memset(r, 0, sizeof *r);
	r->id = id;
	r->res = res;
	r->persist_blocks = 8;
	CHECK(cudaSetDevice(0));
	CHECK(cudaStreamCreateWithFlags(&r->st[0], cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&r->st[1], cudaStreamNonBlocking));
	r->src_len = 1024ULL * 2 * 10240 + 4096;
	r->dst_len = kRing * 1024ULL * 10240;
	CHECK(cudaMalloc((void **)&r->src, r->src_len));
	CHECK(cudaMalloc((void **)&r->dst, r->dst_len));
	std::vector<unsigned char> pat(r->src_len);
	for (u64 i = 0; i < r->src_len; i++) {
		pat[i] = (unsigned char)(i * 131 + id * 7 + (i >> 12));
	}
	CHECK(cudaMemcpy(r->src, pat.data(), r->src_len, cudaMemcpyHostToDevice));
	CHECK(cudaHostAlloc((void **)&r->ring, kRing * sizeof(ring_slot), cudaHostAllocMapped));
	memset((void *)r->ring, 0, kRing * sizeof(ring_slot));
	CHECK(cudaHostGetDevicePointer((void **)&r->ring_d, r->ring, 0));
	CHECK(cudaHostAlloc((void **)&r->bells, kRing * sizeof(u64), cudaHostAllocMapped));
	memset(r->bells, 0, kRing * sizeof(u64));
	CHECK(cudaHostGetDevicePointer((void **)&r->bells_d, r->bells, 0));
	CHECK(cudaHostAlloc((void **)&r->exited, sizeof(u64), cudaHostAllocMapped));
	*r->exited = 0;
	CHECK(cudaHostGetDevicePointer((void **)&r->exited_d, r->exited, 0));
	const size_t ncounters = kRing + PXN_GATHER_MAX_PARTS * kRing;
	CHECK(cudaMalloc((void **)&r->counters, ncounters * sizeof(unsigned int)));
	CHECK(cudaMemset(r->counters, 0, ncounters * sizeof(unsigned int)));
	CHECK(cudaMalloc((void **)&r->exits, sizeof(unsigned int)));
	CHECK(cudaMemset(r->exits, 0, sizeof(unsigned int)));
	CHECK(cudaHostAlloc((void **)&r->plan, sizeof(pxn_inline_plan), cudaHostAllocDefault));
	CHECK(cudaDeviceSynchronize());
}

// burn_ms times the compute kernel over every SM, the median of 7.
static double burn_ms(float *out, int blocks)
{
	cudaEvent_t a, b;
	CHECK(cudaEventCreate(&a));
	CHECK(cudaEventCreate(&b));
	std::vector<double> v;
	for (int i = 0; i < 7; i++) {
		CHECK(cudaEventRecord(a, 0));
		burn<<<blocks, 256>>>(out, 20000);
		CHECK(cudaEventRecord(b, 0));
		CHECK(cudaEventSynchronize(b));
		float ms;
		CHECK(cudaEventElapsedTime(&ms, a, b));
		v.push_back(ms);
	}
	return pct(v, 0.5);
}

static void idle_cost(shared_results *res)
{
	rank r;
	rank_setup(&r, 0, res);
	int sms;
	CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	float *out;
	const int blocks = sms * 8;
	CHECK(cudaMalloc((void **)&out, (size_t)blocks * 256 * sizeof(float)));
	burn_ms(out, blocks);
	res->burn_alone = burn_ms(out, blocks);
	const int shapes[2] = {2, 8};
	for (int k = 0; k < 2; k++) {
		r.persist_blocks = shapes[k];
		u64 first = r.seq + 1;
		u64 idle = 60000000000ULL;
		void *args[] = {&r.ring_d, &r.counters, &r.bells_d, &first, &idle, &r.exits, &r.exited_d};
		CHECK(cudaLaunchKernel((const void *)probe_persist, dim3(r.persist_blocks), dim3(1024), args, 0, r.st[0]));
		r.persist_up = 1;
		usleep(20000);
		res->burn_beside[k] = burn_ms(out, blocks);
		persist_stop(&r);
	}
}

static void child(int id, shared_results *res)
{
	rank r;
	rank_setup(&r, id, res);
	for (int shi = 0; shi < kNShapes; shi++) {
		for (int m = 0; m < NMECH; m++) {
			run_cell(&r, shi, m);
		}
	}
	CHECK(cudaDeviceSynchronize());
}

static int fork_all(int procs, shared_results *res, void (*fn)(int, shared_results *))
{
	std::vector<pid_t> pids;
	for (int i = 0; i < procs; i++) {
		pid_t p = fork();
		if (p == 0) {
			fn(i, res);
			_exit(0);
		}
		pids.push_back(p);
	}
	int bad = 0;
	for (pid_t p : pids) {
		int st;
		waitpid(p, &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			bad = 1;
		}
	}
	return bad;
}

static void idle_child(int, shared_results *res)
{
	idle_cost(res);
}

int main(int argc, char **argv)
{
	std::vector<int> procs;
	for (int i = 1; i < argc; i++) {
		procs.push_back(atoi(argv[i]));
	}
	if (procs.empty()) {
		procs = {1, 8};
	}
	shared_results *res = (shared_results *)mmap(0, sizeof(shared_results), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int bad = 0;
	for (int np : procs) {
		if (np < 1 || np > 16) {
			fprintf(stderr, "firsthop: %d processes: want 1 to 16\n", np);
			return 2;
		}
		memset(res, 0, sizeof *res);
		pthread_barrierattr_t ba;
		pthread_barrierattr_init(&ba);
		pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
		pthread_barrier_init(&res->barrier, &ba, np);
		if (fork_all(np, res, child)) {
			fprintf(stderr, "firsthop: a process of %d failed\n", np);
			bad = 1;
			continue;
		}
		printf("\n%d process(es); latency: one slot in flight, %d slots, us from post to doorbell seen "
		       "(p50 median over processes, p99 and max the worst); rate: %d in flight, GB/s summed\n",
			np, kLatIters, kDepth);
		printf("%-12s %-14s %9s %9s %9s %9s %s\n", "way", "shape", "p50", "p99", "max", "GB/s", "bytes");
		for (int shi = 0; shi < kNShapes; shi++) {
			for (int m = 0; m < NMECH; m++) {
				std::vector<double> p50;
				double p99 = 0, mx = 0, gb = 0;
				int ok = 1;
				for (int i = 0; i < np; i++) {
					cell &c = res->cells[i][shi][m];
					p50.push_back(c.p50);
					p99 = std::max(p99, c.p99);
					mx = std::max(mx, c.max);
					gb += c.gbps;
					ok = ok && c.ok;
				}
				char sh[32];
				snprintf(sh, sizeof sh, "%ux%llu", kShapes[shi].n, kShapes[shi].size);
				printf("%-12s %-14s %9.1f %9.1f %9.1f %9.2f %s\n", kMech[m], sh, pct(p50, 0.5), p99, mx, gb, ok ? "ok" : "MISMATCH");
				bad |= !ok;
			}
		}
		fflush(stdout);
	}
	memset(res, 0, sizeof *res);
	if (fork_all(1, res, idle_child)) {
		fprintf(stderr, "firsthop: the idle-cost process failed\n");
		return 1;
	}
	printf("\nidle cost: compute kernel (every SM, 8 blocks of 256 each) %.3f ms alone; beside an idle resident copier "
	       "of 2 blocks %.3f ms (%.2f %%), of 8 blocks %.3f ms (%.2f %%)\n",
		res->burn_alone, res->burn_beside[0], 100 * (res->burn_beside[0] / res->burn_alone - 1), res->burn_beside[1],
		100 * (res->burn_beside[1] / res->burn_alone - 1));
	return bad;
}
