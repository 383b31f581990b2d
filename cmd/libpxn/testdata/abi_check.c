// SPDX-License-Identifier: Apache-2.0

/*
 * abi_check: libpxn's error, handle, status and thread rules, checked through
 * the C ABI alone in one process with PXN off. Its transport holds every op
 * until the check completes it with the status it wants to see mapped.
 * Prints "PASS" and exits 0, or names the failed check and exits 1.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pxn.h"

#include <stddef.h>

/* The ABI's layout on LP64: a change here breaks every host built before it. */
/* API version 2's sizes are the prefixes that versions 1 of the options keep. */
_Static_assert(sizeof(void *) != 8 || sizeof(pxn_transport_op) == 72, "pxn_transport_op");
_Static_assert(sizeof(void *) != 8 || offsetof(pxn_transport_op, token) == 32, "pxn_transport_op.token");
_Static_assert(sizeof(void *) != 8 || offsetof(pxn_transport_op, flags) == 44, "pxn_transport_op.flags");
_Static_assert(sizeof(void *) != 8 || offsetof(pxn_transport_op, route) == 48, "pxn_transport_op.route");
_Static_assert(sizeof(void *) != 8 || sizeof(pxn_transport_completion) == 128, "pxn_transport_completion");
_Static_assert(sizeof(void *) != 8 || offsetof(pxn_transport_completion, message) == 16, "completion.message");
_Static_assert(sizeof(void *) != 8 || sizeof(pxn_transport) == 40, "pxn_transport");
_Static_assert(sizeof(void *) != 8 || offsetof(pxn_transport, submit_piece) == 32, "pxn_transport.submit_piece");
_Static_assert(sizeof(void *) != 8 || sizeof(pxn_target_info) == 104, "pxn_target_info");
_Static_assert(sizeof(void *) != 8 || offsetof(pxn_target_info, route) == 88, "pxn_target_info.route");
_Static_assert(sizeof(void *) != 8 || sizeof(pxn_options) == 88, "pxn_options");
_Static_assert(sizeof(void *) != 8 || offsetof(pxn_options, copier) == 40, "pxn_options.copier");
_Static_assert(sizeof(void *) != 8 || offsetof(pxn_options, register_arena) == 48, "pxn_options.register_arena");
_Static_assert(sizeof(void *) != 8 || sizeof(pxn_request) == 48, "pxn_request");
_Static_assert(sizeof(pxn_task_status) == 16, "pxn_task_status");
_Static_assert(sizeof(pxn_counters) == 128, "pxn_counters");
_Static_assert(offsetof(pxn_counters, config_refused) == 120, "pxn_counters.config_refused");
_Static_assert(offsetof(pxn_counters, copier) == 104, "pxn_counters.copier");
_Static_assert(offsetof(pxn_counters, relayed_bytes) == 8, "pxn_counters.relayed_bytes");

#define CHECK(cond)                                                                          \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			char m_[PXN_ERROR_MAX];                                              \
			pxn_last_error(m_, sizeof(m_));                                      \
			fprintf(stderr, "FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, \
				#cond, m_);                                                  \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

#define CHECK_RC(call, want) CHECK((call) == (want))

#define MAX_HELD 4096

typedef struct held_op {
	pxn_transport_op op;
	char target[PXN_MAX_SESSION + 1];
} held_op;

typedef struct ready_completion {
	uint64_t token;
	int status;
	char message[PXN_MESSAGE_MAX];
} ready_completion;

/* A transport the check drives by hand, or that completes everything at once (autocomplete). */
typedef struct manual {
	pthread_mutex_t mu;
	int busy;
	int refuse;
	int autocomplete;
	held_op held[MAX_HELD];
	size_t nheld;
	ready_completion ready[MAX_HELD];
	size_t nready;
	size_t ops_seen;
	size_t polls_concurrent;
	size_t polls_overlap;
} manual;

static int manual_submit(void *user, const pxn_transport_op *ops, size_t count)
{
	manual *m = user;
	pthread_mutex_lock(&m->mu);
	int rc = PXN_OK;
	if (m->busy) {
		rc = PXN_BUSY;
	} else if (m->refuse) {
		rc = m->refuse;
	} else if (m->nheld + m->nready + count > MAX_HELD) {
		rc = PXN_BUSY;
	} else {
		for (size_t i = 0; i < count; i++) {
			if (m->autocomplete) {
				m->ready[m->nready++] = (ready_completion){.token = ops[i].token, .status = PXN_OK};
				continue;
			}
			held_op *h = &m->held[m->nheld++];
			h->op = ops[i];
			/* The engine's string is valid only during this call. */
			snprintf(h->target, sizeof(h->target), "%s", ops[i].target);
			h->op.target = NULL;
		}
		m->ops_seen += count;
	}
	pthread_mutex_unlock(&m->mu);
	return rc;
}

static size_t manual_poll(void *user, pxn_transport_completion *out, size_t capacity)
{
	manual *m = user;
	if (__atomic_fetch_add(&m->polls_concurrent, 1, __ATOMIC_SEQ_CST) != 0)
		__atomic_fetch_add(&m->polls_overlap, 1, __ATOMIC_SEQ_CST);
	pthread_mutex_lock(&m->mu);
	size_t n = m->nready < capacity ? m->nready : capacity;
	for (size_t i = 0; i < n; i++) {
		out[i].token = m->ready[i].token;
		out[i].status = m->ready[i].status;
		memcpy(out[i].message, m->ready[i].message, PXN_MESSAGE_MAX);
	}
	memmove(m->ready, m->ready + n, (m->nready - n) * sizeof(m->ready[0]));
	m->nready -= n;
	pthread_mutex_unlock(&m->mu);
	__atomic_fetch_sub(&m->polls_concurrent, 1, __ATOMIC_SEQ_CST);
	return n;
}

/* Completes the held op whose source is src. */
static void complete(manual *m, const void *src, int status, const char *msg)
{
	pthread_mutex_lock(&m->mu);
	for (size_t i = 0; i < m->nheld; i++) {
		if (m->held[i].op.src != src)
			continue;
		ready_completion *r = &m->ready[m->nready++];
		r->token = m->held[i].op.token;
		r->status = status;
		snprintf(r->message, sizeof(r->message), "%s", msg ? msg : "");
		m->held[i] = m->held[--m->nheld];
		pthread_mutex_unlock(&m->mu);
		return;
	}
	pthread_mutex_unlock(&m->mu);
	fprintf(stderr, "FAIL: no held op with source %p\n", src);
	exit(1);
}

static const held_op *find_held(manual *m, const void *src)
{
	for (size_t i = 0; i < m->nheld; i++)
		if (m->held[i].op.src == src)
			return &m->held[i];
	return NULL;
}

static int last_error_contains(const char *what)
{
	char msg[PXN_ERROR_MAX];
	pxn_last_error(msg, sizeof(msg));
	return strstr(msg, what) != NULL;
}

static pxn_task_status status_of(pxn_engine_t e, pxn_batch_t b, size_t i)
{
	pxn_task_status st;
	memset(&st, 0xff, sizeof(st));
	CHECK_RC(pxn_get_status(e, b, i, &st), PXN_OK);
	return st;
}

static manual transport_state;
static pxn_transport transport = {
	.struct_size = sizeof(pxn_transport),
	.user = &transport_state,
	.submit = manual_submit,
	.poll = manual_poll,
};

static pxn_options base_options(void)
{
	pxn_options o = {
		.struct_size = sizeof(pxn_options),
		.version = PXN_OPTIONS_VERSION,
		.local_hca = "mlx5_0",
		.transport = &transport,
		.copier = PXN_COPIER_HOST,
	};
	return o;
}

static int no_arena(void *user, void *addr, uint64_t len, int kind, uint64_t *key)
{
	(void)user;
	(void)addr;
	(void)len;
	(void)kind;
	(void)key;
	return PXN_EIO;
}

static void check_open_errors(void)
{
	pxn_engine_t e = 77;
	pxn_options o = base_options();
	CHECK_RC(pxn_open(NULL, &e), PXN_EINVAL);
	CHECK_RC(pxn_open(&o, NULL), PXN_EINVAL);

	o.struct_size = sizeof(pxn_options) - 8;
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);
	CHECK(e == 0);
	CHECK(last_error_contains("struct_size"));

	o = base_options();
	o.version = PXN_OPTIONS_VERSION + 1;
	CHECK_RC(pxn_open(&o, &e), PXN_ENOTSUP);

	o = base_options();
	o.transport = NULL;
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);

	pxn_transport t = transport;
	o = base_options();
	o.transport = &t;
	t.struct_size = 0;
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);
	/* One byte short of API version 3's table is refused; that table is not. */
	t.struct_size = offsetof(pxn_transport, submit_piece) - 1;
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);
	t.struct_size = offsetof(pxn_transport, submit_piece);
	CHECK_RC(pxn_open(&o, &e), PXN_OK);
	CHECK_RC(pxn_close(e, 1000), PXN_OK);
	t = transport;
	t.poll = NULL;
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);

	/* PXN_ABI_CHECK_CUDA=1: the machine has a CUDA driver and a device. */
	o = base_options();
	o.copier = PXN_COPIER_CUDA;
	const char *cuda = getenv("PXN_ABI_CHECK_CUDA");
	if (cuda != NULL && strcmp(cuda, "1") == 0) {
		CHECK_RC(pxn_open(&o, &e), PXN_OK);
		CHECK_RC(pxn_close(e, 1000), PXN_OK);
	} else {
		CHECK_RC(pxn_open(&o, &e), PXN_ENOTSUP);
		CHECK(last_error_contains("not available"));
		CHECK(last_error_contains("libcuda.so.1"));
	}
	o.copier = 42;
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);

	/* Options of version 1 (API version 2) are a shorter struct. */
	o = base_options();
	o.version = 1;
	o.struct_size = (uint32_t)offsetof(pxn_options, register_arena);
	CHECK_RC(pxn_open(&o, &e), PXN_OK);
	CHECK_RC(pxn_close(e, 1000), PXN_OK);
	o.struct_size = (uint32_t)offsetof(pxn_options, register_arena) - 8;
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);
	o = base_options();
	o.struct_size = (uint32_t)offsetof(pxn_options, register_arena);
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);
	CHECK(last_error_contains("version 2 needs"));

	/* Arena callbacks come in pairs; flags must be known. */
	o = base_options();
	o.register_arena = no_arena;
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);
	o = base_options();
	o.flags = 0x80;
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);

	char long_hca[200];
	memset(long_hca, 'x', sizeof(long_hca) - 1);
	long_hca[sizeof(long_hca) - 1] = '\0';
	o = base_options();
	o.local_hca = long_hca;
	CHECK_RC(pxn_open(&o, &e), PXN_EINVAL);

	/* Truncation: the full length comes back, the copy is cut and terminated. */
	char small[8];
	size_t full = pxn_last_error(small, sizeof(small));
	CHECK(full > sizeof(small) - 1);
	CHECK(strlen(small) == sizeof(small) - 1);
	CHECK(pxn_last_error(NULL, 0) == full);
}

static void check_bad_handles(pxn_engine_t e)
{
	pxn_batch_t b = 5;
	pxn_task_status st;
	pxn_counters c = {.struct_size = sizeof(c)};
	pxn_request r = {.op = PXN_OP_WRITE, .src = &b, .len = 1, .target = "tgt", .dst = 0x1000};
	CHECK_RC(pxn_close(0, 0), PXN_EINVAL);
	CHECK_RC(pxn_submit(e + 1000, &r, 1, &b), PXN_EINVAL);
	CHECK(b == 0);
	CHECK(last_error_contains("not open"));
	CHECK_RC(pxn_get_status(e, 12345, 0, &st), PXN_EINVAL);
	CHECK_RC(pxn_get_status(e, e, 0, &st), PXN_EINVAL);
	CHECK_RC(pxn_free_batch(e, 0), PXN_EINVAL);
	CHECK_RC(pxn_get_counters(0, &c), PXN_EINVAL);
	CHECK_RC(pxn_progress(e + 1), PXN_EINVAL);
	CHECK_RC(pxn_is_active(e + 1), PXN_EINVAL);
	CHECK_RC(pxn_has_relay(e + 1, "rail0"), PXN_EINVAL);
	CHECK_RC(pxn_register_memory(e + 1, &c, sizeof(c), PXN_MEM_HOST), PXN_EINVAL);
}

static void check_registration(pxn_engine_t e)
{
	static uint8_t dev[4096], host[4096];
	CHECK_RC(pxn_register_memory(e, NULL, 16, PXN_MEM_DEVICE), PXN_EINVAL);
	CHECK_RC(pxn_register_memory(e, dev, 0, PXN_MEM_DEVICE), PXN_EINVAL);
	CHECK_RC(pxn_register_memory(e, dev, sizeof(dev), 9), PXN_EINVAL);
	CHECK_RC(pxn_register_memory(e, dev, sizeof(dev), PXN_MEM_DEVICE), PXN_OK);
	CHECK_RC(pxn_register_memory(e, dev + 16, 16, PXN_MEM_DEVICE), PXN_EINVAL);
	CHECK_RC(pxn_register_memory(e, host, sizeof(host), PXN_MEM_HOST), PXN_OK);

	CHECK_RC(pxn_register_target(e, NULL, "rmlx5_0", 0x1000, 0x1000), PXN_EINVAL);
	CHECK_RC(pxn_register_target(e, "tgt", "", 0x1000, 0x1000), PXN_EINVAL);
	CHECK_RC(pxn_register_target(e, "tgt", "rmlx5_0", 0x1000, 0), PXN_EINVAL);
	CHECK_RC(pxn_register_target(e, "tgt", "rmlx5_0", UINT64_MAX, 2), PXN_EINVAL);
	CHECK_RC(pxn_register_target(e, "tgt", "rmlx5_0", 0x1000, 0x1000), PXN_OK);
	CHECK_RC(pxn_register_target(e, "tgt", "rmlx5_1", 0x1800, 0x1000), PXN_EINVAL);
	CHECK(last_error_contains("overlaps"));
	CHECK_RC(pxn_register_target(e, "tgt", "rmlx5_1", 0x2000, 0x1000), PXN_OK);
	{
		pxn_target_info info = {.hca_count = 1, .range_base = 0x8000, .range_len = 0x1000, .route = 7, .remote_key = 9};
		snprintf(info.hca, sizeof(info.hca), "%s", "rmlx5_1");
		CHECK_RC(pxn_register_target_info(e, "tgt", &info), PXN_OK);
		CHECK_RC(pxn_register_target_info(e, "tgt", &info), PXN_EINVAL);
		CHECK(last_error_contains("overlaps"));
		info.range_base = 0x10000;
		info.hca_count = 2;
		CHECK_RC(pxn_register_target_info(e, "tgt", &info), PXN_EINVAL);
		CHECK_RC(pxn_register_target_info(e, "tgt", NULL), PXN_EINVAL);
		CHECK_RC(pxn_register_target_info(e, NULL, &info), PXN_EINVAL);
	}
	CHECK_RC(pxn_unregister_target(e, "nope"), PXN_EINVAL);
	CHECK_RC(pxn_unregister_target(e, "tgt"), PXN_OK);
	CHECK_RC(pxn_unregister_target(e, "tgt"), PXN_EINVAL);
	CHECK_RC(pxn_invalidate_target(e, "tgt"), PXN_OK);
	CHECK_RC(pxn_invalidate_target(e, NULL), PXN_OK);
	CHECK_RC(pxn_invalidate_target(e, ""), PXN_OK);
	CHECK_RC(pxn_invalidate_target(0, "tgt"), PXN_EINVAL);
	{
		char long_session[PXN_MAX_SESSION + 10];
		memset(long_session, 's', sizeof(long_session) - 1);
		long_session[sizeof(long_session) - 1] = '\0';
		CHECK_RC(pxn_invalidate_target(e, long_session), PXN_EINVAL);
	}
}

static void check_invalid_submits(pxn_engine_t e, manual *m)
{
	static uint8_t buf[64];
	char long_target[PXN_MAX_SESSION + 10];
	memset(long_target, 't', sizeof(long_target) - 1);
	long_target[sizeof(long_target) - 1] = '\0';
	pxn_request good = {.op = PXN_OP_WRITE, .src = buf, .len = 8, .target = "tgt", .dst = 0x1000};
	pxn_request reqs[2] = {good, good};
	pxn_batch_t b = 99;
	size_t seen = m->ops_seen;

	reqs[1].op = 7;
	CHECK_RC(pxn_submit(e, reqs, 2, &b), PXN_EINVAL);
	CHECK(b == 0);
	CHECK(last_error_contains("request 1"));
	reqs[1] = good;
	reqs[1].target = NULL;
	CHECK_RC(pxn_submit(e, reqs, 2, &b), PXN_EINVAL);
	reqs[1].target = long_target;
	CHECK_RC(pxn_submit(e, reqs, 2, &b), PXN_EINVAL);
	reqs[1].target = "";
	CHECK_RC(pxn_submit(e, reqs, 2, &b), PXN_EINVAL);
	reqs[1] = good;
	reqs[1].src = NULL;
	CHECK_RC(pxn_submit(e, reqs, 2, &b), PXN_EINVAL);
	reqs[1] = good;
	reqs[1].dst = UINT64_MAX - 2;
	CHECK_RC(pxn_submit(e, reqs, 2, &b), PXN_EINVAL);
	CHECK_RC(pxn_submit(e, NULL, 2, &b), PXN_EINVAL);
	CHECK_RC(pxn_submit(e, reqs, 1, NULL), PXN_EINVAL);
	CHECK(m->ops_seen == seen);

	/* An empty batch is a batch: nothing to wait for, nothing to index. */
	pxn_task_status st;
	CHECK_RC(pxn_submit(e, NULL, 0, &b), PXN_OK);
	CHECK(b != 0);
	CHECK_RC(pxn_get_status(e, b, 0, &st), PXN_EINVAL);
	CHECK_RC(pxn_free_batch(e, b), PXN_OK);
}

static void check_status_mapping(pxn_engine_t e, manual *m)
{
	static uint8_t src[5][256];
	pxn_request reqs[5];
	for (int i = 0; i < 5; i++) {
		memset(src[i], i + 1, sizeof(src[i]));
		reqs[i] = (pxn_request){.op = PXN_OP_WRITE, .src = src[i], .len = 100u + (uint64_t)i,
					.target = i == 2 ? "other-target" : "tgt", .dst = 0x1000u * (uint64_t)(i + 1)};
	}
	reqs[4].op = PXN_OP_READ;
	pxn_batch_t b = 0;
	CHECK_RC(pxn_submit(e, reqs, 5, &b), PXN_OK);
	CHECK(b != 0);

	const held_op *h = find_held(m, src[4]);
	CHECK(h != NULL && h->op.read == 1 && h->op.len == 104 && h->op.dst == 0x5000 && strcmp(h->target, "tgt") == 0);
	h = find_held(m, src[2]);
	CHECK(h != NULL && h->op.read == 0 && strcmp(h->target, "other-target") == 0);

	for (size_t i = 0; i < 5; i++) {
		pxn_task_status st = status_of(e, b, i);
		CHECK(st.state == PXN_TASK_WAITING && st.transferred == 0);
	}
	pxn_task_status st;
	CHECK_RC(pxn_get_status(e, b, 5, &st), PXN_EINVAL);
	CHECK_RC(pxn_get_status(e, b, 0, NULL), PXN_EINVAL);
	CHECK_RC(pxn_free_batch(e, b), PXN_BUSY);
	CHECK(last_error_contains("pending"));

	complete(m, src[0], PXN_OK, NULL);
	complete(m, src[1], PXN_ETIMEDOUT, "no ack from peer");
	complete(m, src[2], PXN_EINVAL, "no such segment");
	complete(m, src[3], PXN_EIO, "link down");
	st = status_of(e, b, 0);
	CHECK(st.state == PXN_TASK_COMPLETED && st.transferred == 100);
	st = status_of(e, b, 1);
	CHECK(st.state == PXN_TASK_TIMEOUT && st.transferred == 0);
	CHECK(last_error_contains("no ack from peer"));
	st = status_of(e, b, 2);
	CHECK(st.state == PXN_TASK_INVALID);
	CHECK(last_error_contains("no such segment"));
	st = status_of(e, b, 3);
	CHECK(st.state == PXN_TASK_FAILED);
	CHECK(last_error_contains("link down"));
	CHECK(status_of(e, b, 4).state == PXN_TASK_WAITING);
	CHECK_RC(pxn_free_batch(e, b), PXN_BUSY);
	complete(m, src[4], PXN_OK, NULL);
	st = status_of(e, b, 4);
	CHECK(st.state == PXN_TASK_COMPLETED && st.transferred == 104);
	CHECK_RC(pxn_free_batch(e, b), PXN_OK);
	CHECK_RC(pxn_free_batch(e, b), PXN_EINVAL);
	CHECK_RC(pxn_get_status(e, b, 0, &st), PXN_EINVAL);
}

static void check_busy_and_refused(pxn_engine_t e, manual *m)
{
	static uint8_t src[3][64];
	pxn_request r = {.op = PXN_OP_WRITE, .src = src[0], .len = 64, .target = "tgt", .dst = 0x1000};
	pxn_batch_t b;

	/* Busy: the engine keeps the op and retries; the task stays pending. */
	m->busy = 1;
	size_t seen = m->ops_seen;
	CHECK_RC(pxn_submit(e, &r, 1, &b), PXN_OK);
	CHECK(status_of(e, b, 0).state == PXN_TASK_WAITING);
	CHECK(m->ops_seen == seen);
	m->busy = 0;
	CHECK_RC(pxn_progress(e), PXN_OK);
	CHECK(m->ops_seen == seen + 1);
	complete(m, src[0], PXN_OK, NULL);
	CHECK(status_of(e, b, 0).state == PXN_TASK_COMPLETED);
	CHECK_RC(pxn_free_batch(e, b), PXN_OK);

	/* Refused: the code maps like a failed completion. */
	m->refuse = PXN_EIO;
	r.src = src[1];
	CHECK_RC(pxn_submit(e, &r, 1, &b), PXN_OK);
	CHECK(status_of(e, b, 0).state == PXN_TASK_FAILED);
	CHECK(last_error_contains("refused"));
	CHECK_RC(pxn_free_batch(e, b), PXN_OK);
	m->refuse = PXN_EINVAL;
	r.src = src[2];
	CHECK_RC(pxn_submit(e, &r, 1, &b), PXN_OK);
	CHECK(status_of(e, b, 0).state == PXN_TASK_INVALID);
	CHECK_RC(pxn_free_batch(e, b), PXN_OK);
	m->refuse = 0;
}

static void check_counters(pxn_engine_t e)
{
	pxn_counters c;
	memset(&c, 0, sizeof(c));
	c.struct_size = 4;
	CHECK_RC(pxn_get_counters(e, &c), PXN_EINVAL);
	CHECK_RC(pxn_get_counters(e, NULL), PXN_EINVAL);
	c.struct_size = sizeof(c);
	CHECK_RC(pxn_get_counters(e, &c), PXN_OK);
	CHECK(c.struct_size == sizeof(c));
	CHECK(c.pxn_active == 0 && c.relayed_bytes == 0 && c.forwarded_bytes == 0);
	/* PXN off: no copier runs; every batch of the checks so far was freed. */
	CHECK(c.copier == 0 && c.live_batches == 0);
	/* 100..104 from the mapping check and three 64-byte writes. */
	CHECK(c.direct_bytes == 100 + 101 + 102 + 103 + 104 + 3 * 64);

	/* An older, shorter struct: nothing past its end is written. */
	memset(&c, 0xab, sizeof(c));
	c.struct_size = 16;
	CHECK_RC(pxn_get_counters(e, &c), PXN_OK);
	CHECK(c.struct_size == 16 && c.relayed_bytes == 0);
	CHECK(c.fallback_bytes == UINT64_C(0xabababababababab));
}

static void check_relay_queries(pxn_engine_t e)
{
	CHECK_RC(pxn_is_active(e), 0);
	CHECK_RC(pxn_has_relay(e, "rail1"), 0);
	CHECK_RC(pxn_has_relay(e, NULL), PXN_EINVAL);
	CHECK_RC(pxn_wait_relay(e, "rail1", 10), PXN_ENOTSUP);
}

static void *bad_call(void *arg)
{
	(void)arg;
	CHECK_RC(pxn_close(0, 0), PXN_EINVAL);
	CHECK(last_error_contains("engine handle 0"));
	return NULL;
}

static void check_thread_messages(pxn_engine_t e)
{
	CHECK_RC(pxn_free_batch(e, 424242), PXN_EINVAL);
	char before[PXN_ERROR_MAX], after[PXN_ERROR_MAX];
	pxn_last_error(before, sizeof(before));
	CHECK(strstr(before, "424242") != NULL);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, bad_call, NULL) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	pxn_last_error(after, sizeof(after));
	CHECK(strcmp(before, after) == 0);
}

typedef struct worker {
	pxn_engine_t e;
	int id;
	uint8_t buf[4][512];
} worker;

static void *submit_loop(void *arg)
{
	worker *w = arg;
	for (int round = 0; round < 50; round++) {
		pxn_request reqs[4];
		for (int i = 0; i < 4; i++)
			reqs[i] = (pxn_request){.op = PXN_OP_WRITE, .src = w->buf[i], .len = 512, .target = "tgt",
						.dst = 0x1000u * (uint64_t)(w->id * 4 + i + 1)};
		pxn_batch_t b;
		CHECK_RC(pxn_submit(w->e, reqs, 4, &b), PXN_OK);
		for (int i = 0; i < 4; i++) {
			pxn_task_status st;
			do {
				CHECK_RC(pxn_get_status(w->e, b, (size_t)i, &st), PXN_OK);
			} while (st.state == PXN_TASK_WAITING);
			CHECK(st.state == PXN_TASK_COMPLETED && st.transferred == 512);
		}
		CHECK_RC(pxn_free_batch(w->e, b), PXN_OK);
	}
	return NULL;
}

static void check_concurrent(pxn_engine_t e, manual *m)
{
	enum { N = 4 };
	static worker ws[N];
	pthread_t ts[N];
	m->autocomplete = 1;
	for (int i = 0; i < N; i++) {
		ws[i].e = e;
		ws[i].id = i;
		CHECK(pthread_create(&ts[i], NULL, submit_loop, &ws[i]) == 0);
	}
	for (int i = 0; i < N; i++)
		CHECK(pthread_join(ts[i], NULL) == 0);
	m->autocomplete = 0;
	CHECK(m->polls_overlap == 0);
}

static void check_close(pxn_engine_t e, manual *m)
{
	static uint8_t src[32];
	pxn_request r = {.op = PXN_OP_WRITE, .src = src, .len = sizeof(src), .target = "tgt", .dst = 0x1000};
	pxn_batch_t b;
	CHECK_RC(pxn_submit(e, &r, 1, &b), PXN_OK);
	CHECK(find_held(m, src) != NULL);
	CHECK_RC(pxn_close(e, 50), PXN_ETIMEDOUT);
	CHECK(last_error_contains("pending"));
	pxn_task_status st;
	CHECK_RC(pxn_get_status(e, b, 0, &st), PXN_EINVAL);
	CHECK_RC(pxn_close(e, 0), PXN_EINVAL);
	CHECK_RC(pxn_submit(e, &r, 1, &b), PXN_EINVAL);
}

/*
 * The host frees every batch: a host that leaks them meets PXN_ETOOMANY at
 * max_batches, with a message that says what to do, and recovers by freeing.
 */
static void check_live_batches(manual *m)
{
	static uint8_t src[8];
	pxn_options o = base_options();
	o.max_batches = 3;
	pxn_engine_t e = 0;
	CHECK_RC(pxn_open(&o, &e), PXN_OK);
	m->autocomplete = 1;
	pxn_request r = {.op = PXN_OP_WRITE, .src = src, .len = sizeof(src), .target = "tgt", .dst = 0x1000};
	pxn_batch_t b[4] = {0};
	for (int i = 0; i < 3; i++)
		CHECK_RC(pxn_submit(e, &r, 1, &b[i]), PXN_OK);
	CHECK_RC(pxn_submit(e, &r, 1, &b[3]), PXN_ETOOMANY);
	CHECK(b[3] == 0);
	CHECK(last_error_contains("pxn_free_batch"));
	pxn_counters c = {.struct_size = sizeof(c)};
	CHECK_RC(pxn_get_counters(e, &c), PXN_OK);
	CHECK(c.live_batches == 3);
	/* Final tasks do not free their batch. */
	CHECK(status_of(e, b[0], 0).state == PXN_TASK_COMPLETED);
	CHECK_RC(pxn_submit(e, &r, 1, &b[3]), PXN_ETOOMANY);
	CHECK_RC(pxn_free_batch(e, b[0]), PXN_OK);
	CHECK_RC(pxn_submit(e, &r, 1, &b[0]), PXN_OK);
	for (int i = 0; i < 3; i++) {
		CHECK(status_of(e, b[i], 0).state == PXN_TASK_COMPLETED);
		CHECK_RC(pxn_free_batch(e, b[i]), PXN_OK);
	}
	CHECK_RC(pxn_get_counters(e, &c), PXN_OK);
	CHECK(c.live_batches == 0);
	m->autocomplete = 0;
	CHECK_RC(pxn_close(e, 1000), PXN_OK);
}

static int no_target(void *user, const char *session, uint64_t dst, pxn_target_info *out)
{
	(void)user;
	(void)session;
	(void)dst;
	(void)out;
	return PXN_EINVAL;
}

int main(void)
{
	CHECK(pthread_mutex_init(&transport_state.mu, NULL) == 0);
	CHECK(pxn_api_version() == PXN_API_VERSION);
	CHECK(pxn_last_error(NULL, 0) == 0);
	const int codes[] = {PXN_OK,  PXN_EINVAL,    PXN_BUSY,      PXN_ENOTSUP, PXN_ECLOSED,
			     PXN_EIO, PXN_ETIMEDOUT, PXN_EINTERNAL, PXN_ETOOMANY, PXN_ESTALE};
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
		CHECK(pxn_strerror(codes[i]) != NULL);
		CHECK(strcmp(pxn_strerror(codes[i]), pxn_strerror(12345)) != 0);
		for (size_t j = 0; j < i; j++)
			CHECK(strcmp(pxn_strerror(codes[i]), pxn_strerror(codes[j])) != 0);
	}

	check_open_errors();

	/*
	 * A bad PXN setting never fails pxn_open: the variables are read at the
	 * call, and the engine comes up direct-only.
	 */
	CHECK(setenv("MC_PXN_ENABLE", "1", 1) == 0);
	CHECK(setenv("MC_PXN_GROUP_ID", "not a group!", 1) == 0);
	pxn_engine_t e = 0;
	pxn_options o = base_options();
	CHECK_RC(pxn_open(&o, &e), PXN_OK);
	CHECK(e != 0);
	CHECK(unsetenv("MC_PXN_ENABLE") == 0 && unsetenv("MC_PXN_GROUP_ID") == 0);

	check_bad_handles(e);
	check_registration(e);
	check_invalid_submits(e, &transport_state);
	check_status_mapping(e, &transport_state);
	check_busy_and_refused(e, &transport_state);
	check_counters(e);
	check_relay_queries(e);
	check_thread_messages(e);
	check_concurrent(e, &transport_state);
	check_close(e, &transport_state);

	/* With a resolve callback the engine has no target table. */
	o = base_options();
	o.resolve = no_target;
	pxn_engine_t e2 = 0;
	CHECK_RC(pxn_open(&o, &e2), PXN_OK);
	CHECK(e2 != 0 && e2 != e);
	CHECK_RC(pxn_register_target(e2, "tgt", "rmlx5_0", 0x1000, 0x1000), PXN_EINVAL);
	CHECK_RC(pxn_close(e2, 1000), PXN_OK);

	check_live_batches(&transport_state);

	printf("PASS\n");
	return 0;
}
