// SPDX-License-Identifier: Apache-2.0

#ifndef PXN_LIBPXN_SHIM_H
#define PXN_LIBPXN_SHIM_H

#include <stddef.h>
#include <stdint.h>

#define PXN_NO_PROTOTYPES
#include "pxn.h"

/* Internal to libpxn: not exported from the shared object. */
#define PXNLIB_HIDDEN __attribute__((visibility("hidden")))

/* Stores the calling thread's error message (truncated to PXN_ERROR_MAX-1). */
PXNLIB_HIDDEN void pxnlib_set_error(const char *msg, size_t len);

/*
 * Calls into the host's callbacks: Go cannot call a C function pointer, so
 * each goes through one of these. user is the host's context pointer, kept
 * by Go as an integer.
 */
PXNLIB_HIDDEN int pxnlib_call_submit(pxn_transport_submit_fn fn, uintptr_t user, const pxn_transport_op *ops, size_t count);
PXNLIB_HIDDEN int pxnlib_call_submit_piece(pxn_transport_submit_piece_fn fn, uintptr_t user, const pxn_transport_op *ops, size_t count, uint64_t token);
PXNLIB_HIDDEN size_t pxnlib_call_poll(pxn_transport_poll_fn fn, uintptr_t user, pxn_transport_completion *out, size_t capacity);
PXNLIB_HIDDEN int pxnlib_call_resolve(pxn_resolve_fn fn, uintptr_t user, const char *session, uint64_t dst, pxn_target_info *out);
PXNLIB_HIDDEN int pxnlib_call_register_arena(pxn_register_arena_fn fn, uintptr_t user, uintptr_t addr, uint64_t len, int kind, uint64_t *local_key);
PXNLIB_HIDDEN int pxnlib_call_deregister_arena(pxn_deregister_arena_fn fn, uintptr_t user, uintptr_t addr, uint64_t len, uint64_t local_key);

#endif
