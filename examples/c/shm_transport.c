// SPDX-License-Identifier: Apache-2.0

#define _POSIX_C_SOURCE 200809L

#include "shm_transport.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct shm_target {
	char session[PXN_MAX_SESSION + 1];
	uint8_t *mem;
	uint64_t base;
	uint64_t len;
	uint64_t route;
} shm_target;

/* An op as the transport keeps it: the engine's array is gone after submit. */
typedef struct queued_op {
	uint8_t *local;
	uint64_t len;
	int target;
	uint64_t dst;
	uint64_t token;
	int read;
	/* Set at submit: the op names a route the transport no longer honours. */
	int stale;
	/*
	 * An op of a Piece taken whole (submit_piece): token is the Piece's,
	 * and only its last op (piece_end) reports, for all of them.
	 */
	int piece;
	int piece_end;
} queued_op;

struct shm_transport {
	pthread_mutex_t mu;
	queued_op *q;
	size_t head;
	size_t count;
	size_t alloc;
	size_t capacity;
	unsigned busy_every;
	uint64_t submits;
	uint64_t busy;

	/* Used by poll only; the engine never runs two polls at once. */
	queued_op *batch;
	size_t batch_alloc;

	shm_target targets[SHM_TRANSPORT_MAX_TARGETS];
	int ntargets;

#if PXN_API_VERSION >= 3
	int refuse_arena;
	/* The engine registers its arena one lane at a time: a range each. */
	struct {
		uint8_t *addr;
		uint64_t len;
		uint64_t key;
	} arena[SHM_TRANSPORT_ARENA_RANGES];
	uint64_t arena_keys;
	shm_transport_stats stats;
#endif
};

shm_transport *shm_transport_create(size_t capacity)
{
	shm_transport *t = calloc(1, sizeof(*t));
	if (t == NULL)
		return NULL;
	if (pthread_mutex_init(&t->mu, NULL) != 0) {
		free(t);
		return NULL;
	}
	t->capacity = capacity;
	return t;
}

void shm_transport_destroy(shm_transport *t)
{
	if (t == NULL)
		return;
	for (int i = 0; i < t->ntargets; i++)
		munmap(t->targets[i].mem, t->targets[i].len);
	pthread_mutex_destroy(&t->mu);
	free(t->q);
	free(t->batch);
	free(t);
}

int shm_transport_add_target(shm_transport *t, const char *session, const char *path, uint64_t base,
			     uint64_t len)
{
	if (t->ntargets == SHM_TRANSPORT_MAX_TARGETS || strlen(session) > PXN_MAX_SESSION || len == 0)
		return -1;
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	struct stat st;
	if (fstat(fd, &st) != 0 || ((uint64_t)st.st_size < len && ftruncate(fd, (off_t)len) != 0)) {
		close(fd);
		return -1;
	}
	void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (mem == MAP_FAILED)
		return -1;
	shm_target *tg = &t->targets[t->ntargets++];
	strcpy(tg->session, session);
	tg->mem = mem;
	tg->base = base;
	tg->len = len;
	tg->route = ((uint64_t)t->ntargets << 32) | 1u;
	return 0;
}

static int find_target(const shm_transport *t, const char *session)
{
	for (int i = 0; i < t->ntargets; i++)
		if (strcmp(t->targets[i].session, session) == 0)
			return i;
	return -1;
}

/* Makes room for n more ops at the tail; called with mu held. */
static int reserve(shm_transport *t, size_t n)
{
	if (t->head + t->count + n <= t->alloc)
		return 0;
	if (t->head > 0) {
		memmove(t->q, t->q + t->head, t->count * sizeof(*t->q));
		t->head = 0;
	}
	if (t->count + n <= t->alloc)
		return 0;
	size_t alloc = t->alloc ? t->alloc : 64;
	while (alloc < t->count + n)
		alloc *= 2;
	queued_op *q = realloc(t->q, alloc * sizeof(*q));
	if (q == NULL)
		return -1;
	t->q = q;
	t->alloc = alloc;
	return 0;
}

/*
 * Queues count ops, or none with PXN_BUSY. A Piece (piece set) counts as one
 * op toward the capacity, and its ops report once, under token.
 */
static int queue_ops(shm_transport *t, const pxn_transport_op *ops, size_t count, int piece, uint64_t token)
{
	pthread_mutex_lock(&t->mu);
	t->submits++;
	size_t counts = piece ? 1 : count;
	if ((t->busy_every > 0 && t->submits % t->busy_every == 0) ||
	    (t->count > 0 && t->count + counts > t->capacity)) {
		t->busy++;
		pthread_mutex_unlock(&t->mu);
		return PXN_BUSY;
	}
	if (reserve(t, count) != 0) {
		pthread_mutex_unlock(&t->mu);
		return PXN_EIO;
	}
	for (size_t i = 0; i < count; i++) {
		queued_op *q = &t->q[t->head + t->count + i];
		q->local = ops[i].src;
		q->len = ops[i].len;
		/* The session string is the engine's and dies with this call. */
		q->target = find_target(t, ops[i].target);
		q->dst = ops[i].dst;
		q->token = piece ? token : ops[i].token;
		q->read = ops[i].read != 0;
		q->stale = 0;
		q->piece = piece;
		q->piece_end = piece && i == count - 1;
#if PXN_API_VERSION >= 3
		const pxn_transport_op *op = &ops[i];
		if (op->flags & PXN_OP_RELAYED) {
			t->stats.relayed_ops++;
			const uint8_t *src = op->src;
			int in = 0;
			for (int r = 0; r < SHM_TRANSPORT_ARENA_RANGES && !in; r++)
				in = t->arena[r].addr != NULL && src >= t->arena[r].addr &&
				     (uint64_t)(src - t->arena[r].addr) + op->len <= t->arena[r].len &&
				     (op->flags & PXN_OP_LOCAL_KEY) && op->local_key == t->arena[r].key;
			if (!in)
				t->stats.bad_keys++;
		}
		if (op->flags & PXN_OP_ROUTED) {
			t->stats.routed_ops++;
			/* The handle names the target: a stale one must not write. */
			int k = (int)(op->route >> 32) - 1;
			if (k < 0 || k >= t->ntargets || k != q->target || op->route != t->targets[k].route) {
				q->stale = 1;
				t->stats.stale_ops++;
			} else if (op->remote_key != shm_transport_remote_key(t, k)) {
				t->stats.bad_keys++;
			}
		}
#endif
	}
	t->count += count;
#if PXN_API_VERSION >= 4
	if (piece)
		t->stats.pieces++;
#endif
	pthread_mutex_unlock(&t->mu);
	return PXN_OK;
}

int shm_transport_submit(void *user, const pxn_transport_op *ops, size_t count)
{
	return queue_ops(user, ops, count, 0, 0);
}

#if PXN_API_VERSION >= 4
int shm_transport_submit_piece(void *user, const pxn_transport_op *ops, size_t count, uint64_t token)
{
	if (count == 0)
		return PXN_EINVAL;
	return queue_ops(user, ops, count, 1, token);
}
#endif

static void fail(pxn_transport_completion *c, int status, const char *msg, const queued_op *op)
{
	c->status = status;
	snprintf(c->message, sizeof(c->message), "%s (dst 0x%llx, %llu bytes)", msg,
		 (unsigned long long)op->dst, (unsigned long long)op->len);
}

/* Moves op's bytes, or fills c with why it cannot. */
static void perform(shm_transport *t, const queued_op *op, pxn_transport_completion *c)
{
	if (op->target < 0) {
		fail(c, PXN_EINVAL, "unknown target session", op);
		return;
	}
#if PXN_API_VERSION >= 3
	if (op->stale) {
		fail(c, PXN_ESTALE, "stale route handle", op);
		return;
	}
#endif
	const shm_target *tg = &t->targets[op->target];
	if (op->dst < tg->base || op->dst - tg->base > tg->len || op->len > tg->len - (op->dst - tg->base)) {
		fail(c, PXN_EINVAL, "destination outside the target", op);
		return;
	}
	uint8_t *remote = tg->mem + (op->dst - tg->base);
	if (op->read)
		memcpy(op->local, remote, op->len);
	else
		memcpy(remote, op->local, op->len);
}

size_t shm_transport_poll(void *user, pxn_transport_completion *out, size_t capacity)
{
	shm_transport *t = user;
	pthread_mutex_lock(&t->mu);
	/* Ops up to capacity reports; a Piece's ops report once, at its end. */
	size_t n = 0, reports = 0;
	while (n < t->count && reports < capacity) {
		const queued_op *q = &t->q[t->head + n];
		n++;
		if (!q->piece || q->piece_end)
			reports++;
	}
	if (n == 0) {
		pthread_mutex_unlock(&t->mu);
		return 0;
	}
	if (n > t->batch_alloc) {
		queued_op *b = realloc(t->batch, n * sizeof(*b));
		if (b == NULL) {
			pthread_mutex_unlock(&t->mu);
			return 0;
		}
		t->batch = b;
		t->batch_alloc = n;
	}
	memcpy(t->batch, t->q + t->head, n * sizeof(*t->batch));
	t->head += n;
	t->count -= n;
	pthread_mutex_unlock(&t->mu);

	/* The copies run outside the lock, so submitters never wait for them. */
	size_t k = 0;
	pxn_transport_completion piece = {.status = PXN_OK};
	for (size_t i = 0; i < n; i++) {
		const queued_op *op = &t->batch[i];
		pxn_transport_completion c = {.token = op->token, .status = PXN_OK};
		perform(t, op, &c);
		if (op->piece) {
			/* A Piece reports its first failure, once, at its end. */
			if (piece.status == PXN_OK && c.status != PXN_OK)
				piece = c;
			if (!op->piece_end)
				continue;
			c.status = piece.status;
			memcpy(c.message, piece.message, sizeof(c.message));
			piece = (pxn_transport_completion){.status = PXN_OK};
		}
		out[k++] = c;
	}
	return k;
}

void shm_transport_set_busy_every(shm_transport *t, unsigned n)
{
	t->busy_every = n;
}

uint64_t shm_transport_busy_count(shm_transport *t)
{
	pthread_mutex_lock(&t->mu);
	uint64_t n = t->busy;
	pthread_mutex_unlock(&t->mu);
	return n;
}

#if PXN_API_VERSION >= 3
/* Route k+1 in the high half names the target; the low half is its generation. */
uint64_t shm_transport_route(shm_transport *t, int k)
{
	pthread_mutex_lock(&t->mu);
	uint64_t r = t->targets[k].route;
	pthread_mutex_unlock(&t->mu);
	return r;
}

uint64_t shm_transport_remote_key(shm_transport *t, int k)
{
	(void)t;
	return UINT64_C(0x5eed0000) + (uint64_t)k;
}

void shm_transport_renew_route(shm_transport *t, int k)
{
	pthread_mutex_lock(&t->mu);
	t->targets[k].route++;
	pthread_mutex_unlock(&t->mu);
}

int shm_transport_register_arena(void *user, void *addr, uint64_t len, int kind, uint64_t *local_key)
{
	shm_transport *t = user;
	pthread_mutex_lock(&t->mu);
	int rc = PXN_EIO;
	int free = -1;
	for (int r = 0; r < SHM_TRANSPORT_ARENA_RANGES; r++) {
		if (t->arena[r].addr == addr)
			free = -2;
		else if (t->arena[r].addr == NULL && free == -1)
			free = r;
	}
	if (!t->refuse_arena && free >= 0 && addr != NULL && len != 0 &&
	    (kind == PXN_MEM_HOST || kind == PXN_MEM_DEVICE)) {
		t->arena[free].addr = addr;
		t->arena[free].len = len;
		/* A new key for each registration, as a NIC gives. */
		t->arena[free].key = UINT64_C(0xa7e4a000) + ++t->arena_keys;
		*local_key = t->arena[free].key;
		t->stats.arena_registrations++;
		rc = PXN_OK;
	}
	pthread_mutex_unlock(&t->mu);
	return rc;
}

int shm_transport_deregister_arena(void *user, void *addr, uint64_t len, uint64_t local_key)
{
	shm_transport *t = user;
	pthread_mutex_lock(&t->mu);
	int rc = PXN_EINVAL;
	for (int r = 0; r < SHM_TRANSPORT_ARENA_RANGES; r++) {
		if (t->arena[r].addr == addr && t->arena[r].len == len && t->arena[r].key == local_key) {
			t->arena[r].addr = NULL;
			t->stats.arena_deregistrations++;
			rc = PXN_OK;
			break;
		}
	}
	if (rc != PXN_OK)
		t->stats.bad_keys++;
	pthread_mutex_unlock(&t->mu);
	return rc;
}

void shm_transport_refuse_arena(shm_transport *t)
{
	t->refuse_arena = 1;
}

shm_transport_stats shm_transport_get_stats(shm_transport *t)
{
	pthread_mutex_lock(&t->mu);
	shm_transport_stats s = t->stats;
	pthread_mutex_unlock(&t->mu);
	return s;
}
#endif
