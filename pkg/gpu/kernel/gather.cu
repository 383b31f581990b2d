// SPDX-License-Identifier: Apache-2.0

// PXN's SM gather copy: one launch copies one Piece's entries from local
// device memory into a relay's staging slot (peer memory over NVLink).
//
// hack/gen-ptx.sh compiles this file to gather.ptx, which is committed and
// embedded in the Go binary; the driver JIT-compiles it when the copier
// loads it. Launch shape and plan layout: docs/cuda.md.

struct pxn_entry {
	unsigned long long src;
	unsigned long long dst;
	unsigned long long len;
};

// Vectors each lane keeps in flight per round of a span's body.
#define PXN_UNROLL 4
// A warp copies at least this many bytes: below it the search and the
// entry loads cost more than the copy.
#define PXN_MIN_SPAN 512ULL

// copy_vec copies n bytes from s to d with the 32 lanes of a warp in
// W-byte vectors of type T, U of them in flight per lane, when s and d share
// their alignment modulo W: the bytes before d's first W-aligned address and
// after the last whole vector are copied one by one.
template <typename T, unsigned int W, int U>
static __device__ __forceinline__ void copy_vec(unsigned long long s, unsigned long long d, unsigned long long n, unsigned int lane)
{
	unsigned long long head = (W - (d & (W - 1ULL))) & (W - 1ULL);
	if (head > n) {
		head = n;
	}
	if (lane < head) {
		((unsigned char *)d)[lane] = ((const unsigned char *)s)[lane];
	}
	s += head;
	d += head;
	n -= head;
	const T *sv = (const T *)s;
	T *dv = (T *)d;
	const unsigned long long nv = n / W;
	unsigned long long i = lane;
	for (; i + 32ULL * (U - 1) < nv; i += 32ULL * U) {
		T v[U];
#pragma unroll
		for (int u = 0; u < U; u++) {
			v[u] = __ldg(sv + i + 32ULL * u);
		}
#pragma unroll
		for (int u = 0; u < U; u++) {
			dv[i + 32ULL * u] = v[u];
		}
	}
	for (; i < nv; i += 32) {
		dv[i] = __ldg(sv + i);
	}
	const unsigned long long tail = n - nv * W;
	if (lane < tail) {
		((unsigned char *)d)[nv * W + lane] = ((const unsigned char *)s)[nv * W + lane];
	}
}

// copy_span copies n bytes from s to d with the 32 lanes of a warp, in the
// widest vectors that s and d's alignments allow: 16 bytes when they agree
// modulo 16, 8 or 4 when they agree modulo 8 or 4 (a block of a size that
// is not a multiple of 16 puts every other destination there), bytes
// otherwise. Each lane keeps 64 bytes in flight whatever the width.
static __device__ __forceinline__ void copy_span(unsigned long long s, unsigned long long d, unsigned long long n, unsigned int lane)
{
	const unsigned long long skew = (s ^ d) & 15ULL;
	if (skew == 0) {
		copy_vec<uint4, 16, PXN_UNROLL>(s, d, n, lane);
	} else if ((skew & 7ULL) == 0) {
		copy_vec<uint2, 8, 2 * PXN_UNROLL>(s, d, n, lane);
	} else if ((skew & 3ULL) == 0) {
		copy_vec<unsigned int, 4, 4 * PXN_UNROLL>(s, d, n, lane);
	} else {
		for (unsigned long long i = lane; i < n; i += 32) {
			((unsigned char *)d)[i] = ((const unsigned char *)s)[i];
		}
	}
}

// copy_bytes copies bytes [lo, hi) of the Piece, taken as one stream in
// entry order, with every warp of the grid: the range is cut into equal
// spans, one per warp, so a large entry is split across warps and blocks and
// a warp may cover many small entries. Warp-uniform: all 32 lanes of a warp
// take the same path.
static __device__ __forceinline__ void copy_bytes(const pxn_entry *__restrict__ plan, const unsigned long long *__restrict__ prefix, unsigned int n,
	unsigned long long lo_byte, unsigned long long hi_byte, unsigned long long warp, unsigned long long warps, unsigned int lane)
{
	unsigned long long span = (hi_byte - lo_byte + warps - 1) / warps;
	span = (span + 15ULL) & ~15ULL;
	if (span < PXN_MIN_SPAN) {
		span = PXN_MIN_SPAN;
	}
	unsigned long long pos = lo_byte + warp * span;
	if (pos >= hi_byte) {
		return;
	}
	const unsigned long long end = pos + span < hi_byte ? pos + span : hi_byte;

	// The entry holding byte pos is the last e with prefix[e] <= pos. Each
	// round the 32 lanes probe evenly spaced indices of [lo, hi) and the
	// range shrinks 32-fold: three rounds for 4096 entries.
	unsigned int lo = 0, hi = n;
	while (hi - lo > 1) {
		const unsigned int step = (hi - lo + 31u) / 32u;
		const unsigned int idx = lo + lane * step;
		const bool le = idx < hi && prefix[idx] <= pos;
		const unsigned int k = __popc(__ballot_sync(0xffffffffu, le));
		lo += (k - 1u) * step;
		if (lo + step < hi) {
			hi = lo + step;
		}
	}

	unsigned int e = lo;
	unsigned long long es = prefix[e];
	unsigned long long ee = prefix[e + 1];
	unsigned long long src = plan[e].src;
	unsigned long long dst = plan[e].dst;
	for (;;) {
		const unsigned long long stop = ee < end ? ee : end;
		const bool more = stop < end;
		unsigned long long nsrc = 0, ndst = 0, nee = 0;
		if (more) {
			nsrc = plan[e + 1].src;
			ndst = plan[e + 1].dst;
			nee = prefix[e + 2];
		}
		copy_span(src + (pos - es), dst + (pos - es), stop - pos, lane);
		if (!more) {
			break;
		}
		pos = stop;
		e++;
		es = ee;
		ee = nee;
		src = nsrc;
		dst = ndst;
	}
}

// gather_parts copies the n entries of plan. prefix holds n+1 exclusive
// prefix sums of the entries' lengths (prefix[n] is the Piece's length);
// every entry is non-empty. The Piece is copied in parts, one after the
// other: cuts[p] is the byte where part p ends (cuts[parts-1] ==
// prefix[n]), and every warp copies its span of part p before it starts on
// part p+1, so part 0 is in the slot long before the last part.
//
// The end of a part is signalled by a store of seq into its word: words[p]
// for every part but the last (the part words of the slot's ready line, in
// the relay's control block), when words is not null, and bell (the slot's
// doorbell) for the last, when bell is not null. Each warp, once its span
// of part p is written, counts itself in arrived[p] behind a system-scope
// fence; the warp that completes the count sets arrived[p] back to 0 for
// the slot's next Piece, fences again and stores seq. A reader that sees
// seq there may read the part's bytes (with the doorbell: the whole
// Piece's) from anywhere in the system. Without bell the stream's doorbell
// after the kernel covers the last part.
static __device__ __forceinline__ void gather_parts(const pxn_entry *__restrict__ plan, const unsigned long long *__restrict__ prefix, unsigned int n,
	const unsigned long long *__restrict__ cuts, unsigned int parts, unsigned int *arrived, unsigned long long *words, unsigned long long seq,
	unsigned long long *bell)
{
	const unsigned int lane = threadIdx.x & 31u;
	const unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	const unsigned long long warps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
	unsigned long long lo_byte = 0;
	for (unsigned int p = 0; p < parts; p++) {
		const unsigned long long hi_byte = cuts[p];
		copy_bytes(plan, prefix, n, lo_byte, hi_byte, warp, warps, lane);
		lo_byte = hi_byte;
		unsigned long long *word = p + 1 == parts ? bell : (words == 0 ? 0 : &words[p]);
		if (word == 0) {
			continue;
		}
		__syncwarp();
		if (lane == 0) {
			__threadfence_system();
			if (atomicAdd(&arrived[p], 1u) == (unsigned int)warps - 1u) {
				arrived[p] = 0;
				__threadfence_system();
				*(volatile unsigned long long *)word = seq;
			}
		}
	}
}

// pxn_gather is gather_parts over a plan uploaded to device memory.
extern "C" __global__ void __launch_bounds__(1024) pxn_gather(const pxn_entry *__restrict__ plan, const unsigned long long *__restrict__ prefix, unsigned int n,
	const unsigned long long *__restrict__ cuts, unsigned int parts, unsigned int *arrived, unsigned long long *words, unsigned long long seq,
	unsigned long long *bell)
{
	gather_parts(plan, prefix, n, cuts, parts, arrived, words, seq, bell);
}

// The most entries a plan passed as the kernel's parameter holds: the
// parameter is 16 KiB, half of what a launch may pass.
#define PXN_INLINE_ENTRIES 512

// pxn_inline_plan is a whole gather plan passed by value as the kernel's
// parameter, so that a Piece of a few hundred entries needs no upload and
// no wait for one before its launch. shim.h mirrors the layout.
struct pxn_inline_plan {
	unsigned long long *words;
	unsigned long long seq;
	unsigned int *arrived;
	unsigned int n;
	unsigned int parts;
	unsigned long long cuts[8];
	pxn_entry entries[PXN_INLINE_ENTRIES];
	unsigned long long prefix[PXN_INLINE_ENTRIES + 1];
	unsigned long long *bell;
};

// pxn_gather_inline is gather_parts over the plan in its parameter.
extern "C" __global__ void __launch_bounds__(1024) pxn_gather_inline(const __grid_constant__ pxn_inline_plan p)
{
	gather_parts(p.entries, p.prefix, p.n, p.cuts, p.parts, p.arrived, p.words, p.seq, p.bell);
}
