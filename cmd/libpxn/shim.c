// SPDX-License-Identifier: Apache-2.0

#include <string.h>

#include "pxn.h"
#include "shim.h"

/*
 * One message per host thread: an exported function runs on the thread that
 * called it, so the Go side stores the message of a failed call here and the
 * same thread reads it back with pxn_last_error.
 */
static __thread char pxnlib_error[PXN_ERROR_MAX];
static __thread size_t pxnlib_error_len;

void pxnlib_set_error(const char *msg, size_t len)
{
	if (len > PXN_ERROR_MAX - 1)
		len = PXN_ERROR_MAX - 1;
	if (len > 0)
		memcpy(pxnlib_error, msg, len);
	pxnlib_error[len] = '\0';
	pxnlib_error_len = len;
}

size_t pxn_last_error(char *buf, size_t len)
{
	if (buf != NULL && len > 0) {
		size_t n = pxnlib_error_len < len - 1 ? pxnlib_error_len : len - 1;
		memcpy(buf, pxnlib_error, n);
		buf[n] = '\0';
	}
	return pxnlib_error_len;
}

const char *pxn_strerror(int code)
{
	switch (code) {
	case PXN_OK:
		return "success";
	case PXN_EINVAL:
		return "invalid argument or handle";
	case PXN_BUSY:
		return "busy, try again later";
	case PXN_ENOTSUP:
		return "not supported";
	case PXN_ECLOSED:
		return "engine closing";
	case PXN_EIO:
		return "engine or transport failure";
	case PXN_ETIMEDOUT:
		return "timed out";
	case PXN_EINTERNAL:
		return "internal error in libpxn";
	case PXN_ETOOMANY:
		return "too many live batches";
	case PXN_ESTALE:
		return "stale route handle";
	}
	return "unknown result code";
}

uint32_t pxn_api_version(void)
{
	return PXN_API_VERSION;
}

int pxnlib_call_submit(pxn_transport_submit_fn fn, uintptr_t user, const pxn_transport_op *ops, size_t count)
{
	return fn((void *)user, ops, count);
}

int pxnlib_call_submit_piece(pxn_transport_submit_piece_fn fn, uintptr_t user, const pxn_transport_op *ops, size_t count, uint64_t token)
{
	return fn((void *)user, ops, count, token);
}

size_t pxnlib_call_poll(pxn_transport_poll_fn fn, uintptr_t user, pxn_transport_completion *out, size_t capacity)
{
	return fn((void *)user, out, capacity);
}

int pxnlib_call_resolve(pxn_resolve_fn fn, uintptr_t user, const char *session, uint64_t dst, pxn_target_info *out)
{
	return fn((void *)user, session, dst, out);
}

int pxnlib_call_register_arena(pxn_register_arena_fn fn, uintptr_t user, uintptr_t addr, uint64_t len, int kind, uint64_t *local_key)
{
	return fn((void *)user, (void *)addr, len, kind, local_key);
}

int pxnlib_call_deregister_arena(pxn_deregister_arena_fn fn, uintptr_t user, uintptr_t addr, uint64_t len, uint64_t local_key)
{
	return fn((void *)user, (void *)addr, len, local_key);
}
