// SPDX-License-Identifier: Apache-2.0

/*
 * pxn_example: one rank of a PXN group on the host path, through the C ABI
 * only. Rank r uses HCA mlx5_<r> on rail<r>; target k is a shared-memory file
 * tgt<k> in --dir served by HCA rmlx5_<k> on rail<k>. Each rank writes its own
 * region of every target from memory registered as device memory, so writes
 * to other rails are relayed by the rank on the target's rail, then reads every
 * region back and compares. It prints a "DONE ..." line with its counters,
 * waits for a byte (or end of file) on stdin so that no rank withdraws while
 * others still relay through it, prints the final counters ("FINAL ..."),
 * closes and prints "CLOSED".
 *
 * MC_PXN_RAIL_MAP must map mlx5_<i> and rmlx5_<i> to rail<i>; see
 * docs/c-abi.md and run-example.sh.
 *
 * Built against API version 3 it also registers the staging arena with its
 * transport and hands the engine route handles and remote keys, which its
 * transport checks on every second-hop op; built against version 2 it is
 * the host that version shipped with.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pxn.h"
#include "shm_transport.h"

#define MAX_RANKS 8
#define SMALL_CHUNKS 32

/* The remote address of byte 0 of target k. */
#define TARGET_BASE(k) (UINT64_C(0x100000000000) * (uint64_t)((k) + 1))

typedef struct example {
	int rank;
	int ranks;
	pxn_engine_t engine;
	shm_transport *transport;
	uint64_t region;
} example;

/* The bytes rank writes at offset off of its region of target. */
static uint8_t pattern(unsigned rank, unsigned target, uint64_t off)
{
	uint64_t v = off * UINT64_C(0x9E3779B97F4A7C15) + (uint64_t)(rank + 1) * UINT64_C(0x100000001B3) +
		     (uint64_t)(target + 1) * UINT64_C(0xC2B2AE3D27D4EB4F);
	return (uint8_t)(v >> 56);
}

/*
 * Each region is written as these chunks, in order: one byte, many small
 * writes that share Pieces, odd sizes, and writes of more than one Piece.
 */
static size_t chunk_sizes(uint64_t *out)
{
	size_t n = 0;
	out[n++] = 1;
	for (int i = 0; i < SMALL_CHUNKS; i++)
		out[n++] = 4096;
	out[n++] = 65539;
	out[n++] = (UINT64_C(8) << 20) + 17;
	out[n++] = UINT64_C(5) << 20;
	out[n++] = 3;
	return n;
}

static int die(const example *ex, const char *what, int rc)
{
	char msg[PXN_ERROR_MAX];
	pxn_last_error(msg, sizeof(msg));
	fprintf(stderr, "FAIL rank=%d: %s: %s (%d): %s\n", ex->rank, what, pxn_strerror(rc), rc, msg);
	exit(1);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Polls every task of b until all are final, then checks each completed in full. */
static void wait_batch(const example *ex, pxn_batch_t b, const pxn_request *reqs, size_t n, const char *what)
{
	double deadline = now_ms() + 60000;
	struct timespec pause = {0, 100000};
	for (;;) {
		size_t pending = 0;
		for (size_t i = 0; i < n; i++) {
			pxn_task_status st;
			int rc = pxn_get_status(ex->engine, b, i, &st);
			if (rc != PXN_OK)
				die(ex, "pxn_get_status", rc);
			if (st.state == PXN_TASK_PENDING || st.state == PXN_TASK_WAITING) {
				pending++;
				continue;
			}
			if (st.state != PXN_TASK_COMPLETED || st.transferred != reqs[i].len) {
				char msg[PXN_ERROR_MAX];
				pxn_last_error(msg, sizeof(msg));
				fprintf(stderr, "FAIL rank=%d: %s task %zu: state %d, %llu of %llu bytes: %s\n", ex->rank,
					what, i, st.state, (unsigned long long)st.transferred,
					(unsigned long long)reqs[i].len, msg);
				exit(1);
			}
		}
		if (pending == 0)
			return;
		if (now_ms() > deadline) {
			fprintf(stderr, "FAIL rank=%d: %s: %zu tasks still pending after 60 s\n", ex->rank, what, pending);
			exit(1);
		}
		nanosleep(&pause, NULL);
	}
}

/* The resolve callback of --directory callback: the same answers as the table. */
static int resolve(void *user, const char *session, uint64_t dst, pxn_target_info *out)
{
	const example *ex = user;
	for (int k = 0; k < ex->ranks; k++) {
		char name[32];
		snprintf(name, sizeof(name), "tgt%d", k);
		if (strcmp(name, session) != 0)
			continue;
		uint64_t len = ex->region * (uint64_t)ex->ranks;
		if (dst < TARGET_BASE(k) || dst - TARGET_BASE(k) >= len)
			return PXN_EINVAL;
		out->hca_count = 1;
		snprintf(out->hca, sizeof(out->hca), "rmlx5_%d", k);
		out->range_base = TARGET_BASE(k);
		out->range_len = len;
#if PXN_API_VERSION >= 3
		out->route = shm_transport_route(ex->transport, k);
		out->remote_key = shm_transport_remote_key(ex->transport, k);
#endif
		return PXN_OK;
	}
	return PXN_EINVAL;
}

#if PXN_API_VERSION >= 3
/*
 * Writes reqs until every task has completed, resubmitting the ones that
 * failed, at most five rounds; returns how many tasks failed on the way.
 */
static size_t write_until_done(const example *ex, const pxn_request *reqs, size_t n)
{
	pxn_request *left = calloc(n, sizeof(*left));
	if (left == NULL)
		die(ex, "calloc", PXN_EIO);
	memcpy(left, reqs, n * sizeof(*left));
	size_t nleft = n, failed = 0;
	struct timespec pause = {0, 100000};
	for (int round = 0; nleft > 0; round++) {
		if (round == 5) {
			fprintf(stderr, "FAIL rank=%d: %zu tasks still failing after 5 rounds\n", ex->rank, nleft);
			exit(1);
		}
		pxn_batch_t b;
		int rc = pxn_submit(ex->engine, left, nleft, &b);
		if (rc != PXN_OK)
			die(ex, "pxn_submit(again)", rc);
		size_t keep = 0;
		for (size_t i = 0; i < nleft; i++) {
			pxn_task_status st;
			double deadline = now_ms() + 60000;
			for (;;) {
				if ((rc = pxn_get_status(ex->engine, b, i, &st)) != PXN_OK)
					die(ex, "pxn_get_status", rc);
				if (st.state != PXN_TASK_WAITING)
					break;
				if (now_ms() > deadline) {
					fprintf(stderr, "FAIL rank=%d: a task still WAITING after 60 s\n", ex->rank);
					exit(1);
				}
				nanosleep(&pause, NULL);
			}
			if (st.state != PXN_TASK_COMPLETED)
				left[keep++] = left[i];
		}
		if ((rc = pxn_free_batch(ex->engine, b)) != PXN_OK)
			die(ex, "pxn_free_batch", rc);
		failed += keep;
		nleft = keep;
	}
	free(left);
	return failed;
}
#endif

static void print_counters(const example *ex, const char *tag)
{
	pxn_counters cn = {.struct_size = sizeof(cn)};
	int rc = pxn_get_counters(ex->engine, &cn);
	if (rc != PXN_OK)
		die(ex, "pxn_get_counters", rc);
	printf("%s rank=%d region=%llu pxn_active=%u relayed_bytes=%llu fallback_bytes=%llu direct_bytes=%llu "
	       "forwarded_bytes=%llu failed_pieces=%llu second_hop_failures=%llu transport_busy=%llu\n",
	       tag, ex->rank, (unsigned long long)ex->region, cn.pxn_active, (unsigned long long)cn.relayed_bytes,
	       (unsigned long long)cn.fallback_bytes, (unsigned long long)cn.direct_bytes,
	       (unsigned long long)cn.forwarded_bytes, (unsigned long long)cn.failed_pieces,
	       (unsigned long long)cn.second_hop_failures,
	       (unsigned long long)shm_transport_busy_count(ex->transport));
#if PXN_API_VERSION >= 3
	shm_transport_stats s = shm_transport_get_stats(ex->transport);
	printf("%s3 rank=%d copier=%llu live_batches=%llu relayed_ops=%llu routed_ops=%llu bad_keys=%llu stale_ops=%llu "
	       "arena_registrations=%llu",
	       tag, ex->rank, (unsigned long long)cn.copier, (unsigned long long)cn.live_batches,
	       (unsigned long long)s.relayed_ops, (unsigned long long)s.routed_ops, (unsigned long long)s.bad_keys,
	       (unsigned long long)s.stale_ops, (unsigned long long)s.arena_registrations);
#if PXN_API_VERSION >= 4
	printf(" pieces=%llu config_refused=%llu", (unsigned long long)s.pieces, (unsigned long long)cn.config_refused);
#endif
	printf("\n");
#endif
}

static void usage(void)
{
	fprintf(stderr, "usage: pxn_example --rank R --ranks N --dir DIR [--directory table|callback] "
			"[--busy-every N] [--refuse-arena 0|1] [--wait-relay 1|0] [--stale-check 0|1] [--pieces 1|0]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	example ex = {.rank = -1, .ranks = 2};
	const char *dir = NULL;
	int use_callback = 0;
	int busy_every = 0;
	int refuse_arena = 0;
	int wait_relay = 1;
	int stale_check = 0;
	int whole_pieces = 1;
	for (int i = 1; i < argc; i++) {
		if (i + 1 >= argc)
			usage();
		if (strcmp(argv[i], "--rank") == 0)
			ex.rank = atoi(argv[++i]);
		else if (strcmp(argv[i], "--ranks") == 0)
			ex.ranks = atoi(argv[++i]);
		else if (strcmp(argv[i], "--dir") == 0)
			dir = argv[++i];
		else if (strcmp(argv[i], "--directory") == 0)
			use_callback = strcmp(argv[++i], "callback") == 0;
		else if (strcmp(argv[i], "--busy-every") == 0)
			busy_every = atoi(argv[++i]);
		else if (strcmp(argv[i], "--refuse-arena") == 0)
			refuse_arena = atoi(argv[++i]);
		else if (strcmp(argv[i], "--wait-relay") == 0)
			wait_relay = atoi(argv[++i]);
		else if (strcmp(argv[i], "--stale-check") == 0)
			stale_check = atoi(argv[++i]);
		else if (strcmp(argv[i], "--pieces") == 0)
			whole_pieces = atoi(argv[++i]);
		else
			usage();
	}
	if (dir == NULL || busy_every < 0 || ex.ranks < 1 || ex.ranks > MAX_RANKS || ex.rank < 0 || ex.rank >= ex.ranks)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);

	uint64_t sizes[SMALL_CHUNKS + 8];
	size_t nchunks = chunk_sizes(sizes);
	for (size_t i = 0; i < nchunks; i++)
		ex.region += sizes[i];

	ex.transport = shm_transport_create(256);
	if (ex.transport == NULL)
		die(&ex, "shm_transport_create", PXN_EIO);
	shm_transport_set_busy_every(ex.transport, (unsigned)busy_every);
#if PXN_API_VERSION >= 3
	if (refuse_arena)
		shm_transport_refuse_arena(ex.transport);
#else
	(void)refuse_arena;
#endif
	for (int k = 0; k < ex.ranks; k++) {
		char session[32], path[4096];
		snprintf(session, sizeof(session), "tgt%d", k);
		snprintf(path, sizeof(path), "%s/tgt%d", dir, k);
		if (shm_transport_add_target(ex.transport, session, path, TARGET_BASE(k),
					     ex.region * (uint64_t)ex.ranks) != 0) {
			fprintf(stderr, "FAIL rank=%d: cannot map target %s\n", ex.rank, path);
			return 1;
		}
	}

	char hca[PXN_HCA_NAME_MAX];
	snprintf(hca, sizeof(hca), "mlx5_%d", ex.rank);
	pxn_transport transport = {
		.struct_size = sizeof(pxn_transport),
		.user = ex.transport,
		.submit = shm_transport_submit,
		.poll = shm_transport_poll,
	};
#if PXN_API_VERSION >= 4
	if (whole_pieces)
		transport.submit_piece = shm_transport_submit_piece;
#else
	(void)whole_pieces;
#endif
	pxn_options opts = {
		.struct_size = sizeof(pxn_options),
		.version = PXN_OPTIONS_VERSION,
		.local_hca = hca,
		.transport = &transport,
		.resolve = use_callback ? resolve : NULL,
		.resolve_user = &ex,
		.copier = PXN_COPIER_HOST,
#if PXN_API_VERSION >= 3
		.register_arena = shm_transport_register_arena,
		.deregister_arena = shm_transport_deregister_arena,
		.arena_user = ex.transport,
#endif
	};
	int rc = pxn_open(&opts, &ex.engine);
	if (rc != PXN_OK)
		die(&ex, "pxn_open", rc);
	if (!use_callback) {
		for (int k = 0; k < ex.ranks; k++) {
			char session[32], thca[PXN_HCA_NAME_MAX];
			snprintf(session, sizeof(session), "tgt%d", k);
			snprintf(thca, sizeof(thca), "rmlx5_%d", k);
#if PXN_API_VERSION >= 3
			pxn_target_info info = {.hca_count = 1,
						.range_base = TARGET_BASE(k),
						.range_len = ex.region * (uint64_t)ex.ranks,
						.route = shm_transport_route(ex.transport, k),
						.remote_key = shm_transport_remote_key(ex.transport, k)};
			snprintf(info.hca, sizeof(info.hca), "%s", thca);
			rc = pxn_register_target_info(ex.engine, session, &info);
#else
			rc = pxn_register_target(ex.engine, session, thca, TARGET_BASE(k), ex.region * (uint64_t)ex.ranks);
#endif
			if (rc != PXN_OK)
				die(&ex, "pxn_register_target", rc);
		}
	}

	size_t total = (size_t)(ex.region * (uint64_t)ex.ranks);
	uint8_t *src = malloc(total);
	uint8_t *back = calloc(1, total);
	if (src == NULL || back == NULL)
		die(&ex, "malloc", PXN_EIO);
	for (int k = 0; k < ex.ranks; k++)
		for (uint64_t off = 0; off < ex.region; off++)
			src[(uint64_t)k * ex.region + off] = pattern((unsigned)ex.rank, (unsigned)k, off);
	if ((rc = pxn_register_memory(ex.engine, src, total, PXN_MEM_DEVICE)) != PXN_OK)
		die(&ex, "pxn_register_memory(device)", rc);
	if ((rc = pxn_register_memory(ex.engine, back, total, PXN_MEM_HOST)) != PXN_OK)
		die(&ex, "pxn_register_memory(host)", rc);

	int active = pxn_is_active(ex.engine);
	if (active < 0)
		die(&ex, "pxn_is_active", active);
	if (active && wait_relay) {
		for (int k = 0; k < ex.ranks; k++) {
			char rail[32];
			snprintf(rail, sizeof(rail), "rail%d", k);
			if (k != ex.rank && (rc = pxn_wait_relay(ex.engine, rail, 30000)) != PXN_OK)
				die(&ex, "pxn_wait_relay", rc);
		}
	}

	size_t nw = nchunks * (size_t)ex.ranks;
	pxn_request *writes = calloc(nw, sizeof(*writes));
	pxn_request *reads = calloc((size_t)ex.ranks, sizeof(*reads));
	char (*sessions)[32] = calloc((size_t)ex.ranks, sizeof(*sessions));
	if (writes == NULL || reads == NULL || sessions == NULL)
		die(&ex, "calloc", PXN_EIO);
	size_t w = 0;
	for (int k = 0; k < ex.ranks; k++) {
		snprintf(sessions[k], sizeof(sessions[k]), "tgt%d", k);
		uint64_t region_dst = TARGET_BASE(k) + (uint64_t)ex.rank * ex.region;
		uint64_t off = 0;
		for (size_t c = 0; c < nchunks; c++) {
			writes[w++] = (pxn_request){
				.op = PXN_OP_WRITE,
				.src = src + (uint64_t)k * ex.region + off,
				.len = sizes[c],
				.target = sessions[k],
				.dst = region_dst + off,
				.stream = NULL,
			};
			off += sizes[c];
		}
		reads[k] = (pxn_request){
			.op = PXN_OP_READ,
			.src = back + (uint64_t)k * ex.region,
			.len = ex.region,
			.target = sessions[k],
			.dst = region_dst,
		};
	}

	pxn_batch_t wb, rb;
	if ((rc = pxn_submit(ex.engine, writes, nw, &wb)) != PXN_OK)
		die(&ex, "pxn_submit(writes)", rc);
	wait_batch(&ex, wb, writes, nw, "write");
	if ((rc = pxn_submit(ex.engine, reads, (size_t)ex.ranks, &rb)) != PXN_OK)
		die(&ex, "pxn_submit(reads)", rc);
	wait_batch(&ex, rb, reads, (size_t)ex.ranks, "read");
	if (memcmp(src, back, total) != 0) {
		fprintf(stderr, "FAIL rank=%d: read-back differs from what was written\n", ex.rank);
		return 1;
	}
	if ((rc = pxn_free_batch(ex.engine, wb)) != PXN_OK || (rc = pxn_free_batch(ex.engine, rb)) != PXN_OK)
		die(&ex, "pxn_free_batch", rc);

	print_counters(&ex, "DONE");
	/*
	 * Barrier: peers may still relay through this rank until the driver says
	 * all are done. Only then are the forwarded counters final.
	 */
	(void)getchar();
#if PXN_API_VERSION >= 3
	if (stale_check) {
		/*
		 * Every route handle this transport gave out is replaced, as after
		 * a reconnect, without telling the engine: the relays' cached
		 * routes are stale. A second-hop op that carries one fails with
		 * PXN_ESTALE and writes nothing; the relay drops the route,
		 * resolves the target again (the resolve callback gives the new
		 * handle) and later Pieces go through. Failed tasks are written
		 * again; the read-back then checks every byte.
		 */
		for (int k = 0; k < ex.ranks; k++)
			shm_transport_renew_route(ex.transport, k);
		printf("RENEWED rank=%d\n", ex.rank);
		(void)getchar();
		memset(back, 0, total);
		size_t failed = write_until_done(&ex, writes, nw);
		pxn_batch_t rb2;
		if ((rc = pxn_submit(ex.engine, reads, (size_t)ex.ranks, &rb2)) != PXN_OK)
			die(&ex, "pxn_submit(reads)", rc);
		wait_batch(&ex, rb2, reads, (size_t)ex.ranks, "read");
		if ((rc = pxn_free_batch(ex.engine, rb2)) != PXN_OK)
			die(&ex, "pxn_free_batch", rc);
		if (memcmp(src, back, total) != 0) {
			fprintf(stderr, "FAIL rank=%d: read-back after the stale routes differs\n", ex.rank);
			return 1;
		}
		printf("STALE rank=%d failed_tasks=%zu\n", ex.rank, failed);
		(void)getchar();
	}
#else
	(void)stale_check;
#endif
	print_counters(&ex, "FINAL");

	if ((rc = pxn_close(ex.engine, 5000)) != PXN_OK)
		die(&ex, "pxn_close", rc);
#if PXN_API_VERSION >= 3
	printf("CLOSED rank=%d arena_deregistrations=%llu\n", ex.rank,
	       (unsigned long long)shm_transport_get_stats(ex.transport).arena_deregistrations);
#else
	printf("CLOSED rank=%d\n", ex.rank);
#endif
	shm_transport_destroy(ex.transport);
	free(sessions);
	free(reads);
	free(writes);
	free(back);
	free(src);
	return 0;
}
