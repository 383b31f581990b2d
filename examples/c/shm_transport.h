// SPDX-License-Identifier: Apache-2.0

/*
 * shm_transport: a small host transport for libpxn's callback table. Its
 * "remote" targets are files in shared memory (tmpfs) mapped into this
 * process; a target's remote addresses are [base, base+len) and a transfer
 * to dst touches byte dst-base of the file. Submit only queues; poll moves
 * the bytes and reports completions, as an RDMA completion queue would.
 */
#ifndef PXN_EXAMPLE_SHM_TRANSPORT_H
#define PXN_EXAMPLE_SHM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "pxn.h"

#define SHM_TRANSPORT_MAX_TARGETS 16

typedef struct shm_transport shm_transport;

/*
 * capacity is a soft bound on queued ops: submit answers PXN_BUSY when ops
 * are queued and count more would exceed it. An idle transport takes a
 * submit of any size.
 */
shm_transport *shm_transport_create(size_t capacity);

/* Unmaps every target and frees t. Nothing may call t afterwards. */
void shm_transport_destroy(shm_transport *t);

/*
 * Maps the file at path (created and sized to len when missing) as target
 * session. Call before the transport is handed to pxn_open: the target list
 * is read without a lock.
 */
int shm_transport_add_target(shm_transport *t, const char *session, const char *path, uint64_t base,
			     uint64_t len);

/* The callbacks for pxn_transport; user is the shm_transport. */
int shm_transport_submit(void *user, const pxn_transport_op *ops, size_t count);
size_t shm_transport_poll(void *user, pxn_transport_completion *out, size_t capacity);
#if PXN_API_VERSION >= 4
/*
 * submit_piece: queues a relayed Piece's ops, counted as one toward the
 * capacity; poll reports them once, under token, with the first failure.
 */
int shm_transport_submit_piece(void *user, const pxn_transport_op *ops, size_t count, uint64_t token);
#endif

/*
 * Makes every nth submit answer PXN_BUSY whatever the queue holds, as a full
 * send queue would; 0 turns it off. Call before pxn_open.
 */
void shm_transport_set_busy_every(shm_transport *t, unsigned n);

/* How many submits were answered PXN_BUSY. */
uint64_t shm_transport_busy_count(shm_transport *t);

#if PXN_API_VERSION >= 3
/*
 * The route handle and remote key the transport gives for target index k
 * (the order of shm_transport_add_target), as a real transport would hand
 * out an endpoint and an rkey. A second-hop op that carries another route
 * than the current one fails with PXN_ESTALE and writes nothing.
 */
uint64_t shm_transport_route(shm_transport *t, int k);
uint64_t shm_transport_remote_key(shm_transport *t, int k);

/* Replaces target k's route handle, as a reconnect would. */
void shm_transport_renew_route(shm_transport *t, int k);

/* The most ranges of the staging arena registered at once: the engine
 * registers its arena one lane at a time. */
#define SHM_TRANSPORT_ARENA_RANGES 7

/* The arena callbacks for pxn_options; user is the shm_transport. */
int shm_transport_register_arena(void *user, void *addr, uint64_t len, int kind, uint64_t *local_key);
int shm_transport_deregister_arena(void *user, void *addr, uint64_t len, uint64_t local_key);

/* Makes register_arena fail, as a NIC out of memory regions would. */
void shm_transport_refuse_arena(shm_transport *t);

/*
 * What the transport saw: second-hop ops (relayed), ops with a route
 * (routed), ops whose keys were wrong (bad_keys: any is a bug of the
 * engine), ops refused as stale, arena (de)registrations, and Pieces
 * taken whole.
 */
typedef struct shm_transport_stats {
	uint64_t relayed_ops;
	uint64_t routed_ops;
	uint64_t bad_keys;
	uint64_t stale_ops;
	uint64_t arena_registrations;
	uint64_t arena_deregistrations;
#if PXN_API_VERSION >= 4
	/* Pieces taken whole through submit_piece. */
	uint64_t pieces;
#endif
} shm_transport_stats;

shm_transport_stats shm_transport_get_stats(shm_transport *t);
#endif

#endif
