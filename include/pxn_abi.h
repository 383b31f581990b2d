// SPDX-License-Identifier: Apache-2.0

#ifndef PXN_ABI_H
#define PXN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define PXN_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define PXN_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#define PXN_ABI_VERSION 6

#define PXN_LANE_COUNT 7
#define PXN_SLOTS_PER_LANE 18
#define PXN_SLOT_SIZE (UINT64_C(8) << 20)
#define PXN_LANE_BYTES (PXN_SLOTS_PER_LANE * PXN_SLOT_SIZE)
#define PXN_ARENA_SIZE (PXN_LANE_COUNT * PXN_LANE_BYTES)

#define PXN_MAX_PLANS 4096
#define PXN_MAX_SESSION 256
#define PXN_MAX_PARTS 8
#define PXN_CACHE_LINE 64

#define PXN_REGISTRY_MAGIC UINT64_C(0x31304745524e5850)

#define PXN_STATE_INIT 1
#define PXN_STATE_READY 2
#define PXN_STATE_CLOSING 3

#define PXN_SHARE_IPC_HANDLE 1
#define PXN_SHARE_FD 2
#define PXN_SHARE_LANE_FD 4

#define PXN_ARENA_HOST 1
#define PXN_ARENA_CUDA 2

#define PXN_COMPLETION_OK 0
#define PXN_COMPLETION_INVALID_DESC (-1)
#define PXN_COMPLETION_SECOND_HOP (-2)
#define PXN_COMPLETION_UNRESOLVED (-3)
#define PXN_COMPLETION_RELAY_CLOSING (-4)
#define PXN_COMPLETION_TIMEOUT (-5)

#define PXN_SLOT_OF(seq) ((uint64_t)(((uint64_t)(seq) - 1u) % PXN_SLOTS_PER_LANE))

typedef struct pxn_plan_entry {
	uint64_t dst;
	uint64_t len;
} pxn_plan_entry;

/*
 * Written by the lane's sender while it owns the slot: every field first,
 * commit_seq last with a release store. The relay acquire-loads commit_seq and
 * trusts nothing else until it equals the seq it waits for; it then copies the
 * fields once into private memory and validates only the copy. A Piece of
 * parts > 1 is copied part after part: part_ends[p] (p < parts - 1) counts the
 * plan entries of parts 0..p; the last part ends with the plan.
 */
typedef struct pxn_desc {
	uint64_t commit_seq;
	uint64_t epoch;
	uint64_t piece_len;
	uint32_t plan_count;
	uint32_t session_len;
	uint32_t parts;
	uint32_t part_ends[PXN_MAX_PARTS - 1];
	uint8_t session[PXN_MAX_SESSION];
	pxn_plan_entry plans[PXN_MAX_PLANS];
} pxn_desc;

/*
 * Written by the relay: status first, then a release store of seq. The sender
 * acquire-loads seq and reads status only once seq matches.
 */
typedef struct pxn_completion {
	uint64_t seq;
	int32_t status;
	uint8_t pad0[52];
} pxn_completion;

/*
 * A slot's doorbell, written by the sender's GPU (cuStreamWriteValue64) or by
 * its pump with a release store, after the copy into the slot has completed.
 * The relay acquire-loads it. One cache line per slot. parts[p] holds the seq
 * once part p of a Piece of several parts is in the slot (written by the
 * copy, with a system-scope fence before it); seq covers every part.
 */
typedef struct pxn_ready_word {
	uint64_t seq;
	uint64_t parts[PXN_MAX_PARTS - 1];
} pxn_ready_word;

/* Written only under the registry lock, at lane claim and release. */
typedef struct pxn_lane_owner {
	uint64_t pid;
	uint64_t start_time;
	uint64_t sender_epoch;
	uint64_t lane_epoch;
	uint64_t claimed_at;
	uint64_t pid_ns_dev;
	uint64_t pid_ns_ino;
	uint8_t pad0[8];
} pxn_lane_owner;

/* Written only by the lane's sender; read by inspect. */
typedef struct pxn_sender_progress {
	uint64_t next_seq;
	uint64_t published_seq;
	uint64_t reaped_seq;
	uint8_t pad0[40];
} pxn_sender_progress;

/*
 * Written only by the relay, with release stores; completed_seq advances
 * contiguously. open_epoch is the lane epoch whose ring the relay opened:
 * no second-hop write of an earlier epoch still reads the lane's slots, and
 * a sender writes none of them before it reads its epoch here.
 */
typedef struct pxn_relay_progress {
	uint64_t completed_seq;
	uint64_t open_epoch;
	uint8_t pad0[48];
} pxn_relay_progress;

/*
 * The relay's sleeping flag as a lane's holder sees it: the relay's pump
 * stores 1 before it may sleep and 0 once it runs again; the holder writes
 * the claim's eventfd after a publish only while it loads 1. Every access
 * is sequentially consistent.
 */
typedef struct pxn_relay_wake {
	uint32_t sleeping;
	uint8_t pad0[60];
} pxn_relay_wake;

/*
 * One claim of a lane, the part its holder writes: a sealed memfd made by
 * the relay for each claim, handed to the holder alone and mapped
 * read-write by both. The relay reads it as untrusted.
 */
typedef struct pxn_lane_sender_block {
	pxn_sender_progress sender;
	pxn_ready_word ready[PXN_SLOTS_PER_LANE];
	pxn_desc descs[PXN_SLOTS_PER_LANE];
} pxn_lane_sender_block;

/*
 * One claim of a lane, the part the relay alone writes: a memfd sealed with
 * F_SEAL_FUTURE_WRITE, which the holder can map read-only and nothing else.
 */
typedef struct pxn_lane_relay_block {
	pxn_relay_progress relay;
	pxn_relay_wake wake;
	pxn_completion completions[PXN_SLOTS_PER_LANE];
} pxn_lane_relay_block;

/*
 * A lane as the relay records it in its control file, for inspect: the
 * owner of the current claim and a copy of its progress words, refreshed
 * with the heartbeat. Only the relay writes it.
 */
typedef struct pxn_lane_summary {
	pxn_lane_owner owner;
	pxn_sender_progress sender;
	pxn_relay_progress relay;
} pxn_lane_summary;

/*
 * Written by the owning rank before it is published READY and never changed
 * afterwards, except state and heartbeat (release stores by the owner).
 * The last 64 bytes of pad0 were the wake word of ABI versions 2 to 5.
 */
typedef struct pxn_header {
	uint64_t magic;
	uint32_t abi_version;
	uint32_t header_size;
	uint32_t state;
	uint32_t uid;
	uint64_t pid;
	uint64_t start_time;
	uint64_t boot_epoch;
	uint32_t lane_count;
	uint32_t slots_per_lane;
	uint64_t slot_size;
	uint64_t arena_size;
	uint32_t arena_kind;
	uint32_t rail_len;
	uint8_t rail[48];
	uint32_t hca_len;
	uint32_t arena_shares;
	uint8_t hca[56];
	uint8_t ipc_handle[64];
	uint64_t heartbeat;
	uint8_t pad0[120];
	uint64_t pid_ns_dev;
	uint64_t pid_ns_ino;
	uint8_t pad1[48];
} pxn_header;

#define PXN_FALLBACK_CREDIT_TIMEOUT 0
#define PXN_FALLBACK_RELAY_STALE 1
#define PXN_FALLBACK_RELAY_GONE 2
#define PXN_FALLBACK_LANE_BROKEN 3
#define PXN_FALLBACK_SOURCE_EVENT 4
#define PXN_FALLBACK_NO_LANE 5
#define PXN_FALLBACK_OTHER 6
#define PXN_FALLBACK_REASONS 7

/*
 * A rank's counters, published by its pump at most once a heartbeat. gen is
 * a sequence lock: odd while the pump writes; a reader copies the block
 * between two equal, even loads of gen. device is written before READY.
 */
typedef struct pxn_rank_stats {
	uint64_t gen;
	uint64_t updated_at;
	uint64_t relayed_bytes;
	uint64_t relayed_pieces;
	uint64_t forwarded_bytes;
	uint64_t forwarded_pieces;
	uint64_t direct_bytes;
	uint64_t failed_pieces;
	uint64_t second_hop_failures;
	uint64_t invalid_descs;
	uint64_t credit_waits;
	uint64_t lane_quarantines;
	uint64_t pump_cpu_nanos;
	uint32_t outbound_lanes;
	uint32_t inbound_lanes;
	uint64_t fallback_bytes[8];
	uint64_t fallback_pieces[8];
	uint32_t device_len;
	uint32_t pad0;
	uint8_t device[48];
	uint8_t pad1[88];
} pxn_rank_stats;

typedef struct pxn_control_block {
	pxn_header header;
	pxn_rank_stats stats;
	pxn_lane_summary lanes[PXN_LANE_COUNT];
} pxn_control_block;

PXN_STATIC_ASSERT(offsetof(pxn_plan_entry, dst) == 0, "pxn_plan_entry.dst");
PXN_STATIC_ASSERT(offsetof(pxn_plan_entry, len) == 8, "pxn_plan_entry.len");
PXN_STATIC_ASSERT(sizeof(pxn_plan_entry) == 16, "sizeof pxn_plan_entry");

PXN_STATIC_ASSERT(offsetof(pxn_desc, commit_seq) == 0, "pxn_desc.commit_seq");
PXN_STATIC_ASSERT(offsetof(pxn_desc, epoch) == 8, "pxn_desc.epoch");
PXN_STATIC_ASSERT(offsetof(pxn_desc, piece_len) == 16, "pxn_desc.piece_len");
PXN_STATIC_ASSERT(offsetof(pxn_desc, plan_count) == 24, "pxn_desc.plan_count");
PXN_STATIC_ASSERT(offsetof(pxn_desc, session_len) == 28, "pxn_desc.session_len");
PXN_STATIC_ASSERT(offsetof(pxn_desc, parts) == 32, "pxn_desc.parts");
PXN_STATIC_ASSERT(offsetof(pxn_desc, part_ends) == 36, "pxn_desc.part_ends");
PXN_STATIC_ASSERT(offsetof(pxn_desc, session) == 64, "pxn_desc.session");
PXN_STATIC_ASSERT(offsetof(pxn_desc, plans) == 320, "pxn_desc.plans");
PXN_STATIC_ASSERT(sizeof(pxn_desc) == 65856, "sizeof pxn_desc");

PXN_STATIC_ASSERT(offsetof(pxn_completion, seq) == 0, "pxn_completion.seq");
PXN_STATIC_ASSERT(offsetof(pxn_completion, status) == 8, "pxn_completion.status");
PXN_STATIC_ASSERT(offsetof(pxn_completion, pad0) == 12, "pxn_completion.pad0");
PXN_STATIC_ASSERT(sizeof(pxn_completion) == 64, "sizeof pxn_completion");

PXN_STATIC_ASSERT(offsetof(pxn_ready_word, seq) == 0, "pxn_ready_word.seq");
PXN_STATIC_ASSERT(offsetof(pxn_ready_word, parts) == 8, "pxn_ready_word.parts");
PXN_STATIC_ASSERT(sizeof(pxn_ready_word) == 64, "sizeof pxn_ready_word");

PXN_STATIC_ASSERT(offsetof(pxn_lane_owner, pid) == 0, "pxn_lane_owner.pid");
PXN_STATIC_ASSERT(offsetof(pxn_lane_owner, start_time) == 8, "pxn_lane_owner.start_time");
PXN_STATIC_ASSERT(offsetof(pxn_lane_owner, sender_epoch) == 16, "pxn_lane_owner.sender_epoch");
PXN_STATIC_ASSERT(offsetof(pxn_lane_owner, lane_epoch) == 24, "pxn_lane_owner.lane_epoch");
PXN_STATIC_ASSERT(offsetof(pxn_lane_owner, claimed_at) == 32, "pxn_lane_owner.claimed_at");
PXN_STATIC_ASSERT(offsetof(pxn_lane_owner, pid_ns_dev) == 40, "pxn_lane_owner.pid_ns_dev");
PXN_STATIC_ASSERT(offsetof(pxn_lane_owner, pid_ns_ino) == 48, "pxn_lane_owner.pid_ns_ino");
PXN_STATIC_ASSERT(offsetof(pxn_lane_owner, pad0) == 56, "pxn_lane_owner.pad0");
PXN_STATIC_ASSERT(sizeof(pxn_lane_owner) == 64, "sizeof pxn_lane_owner");

PXN_STATIC_ASSERT(offsetof(pxn_sender_progress, next_seq) == 0, "pxn_sender_progress.next_seq");
PXN_STATIC_ASSERT(offsetof(pxn_sender_progress, published_seq) == 8, "pxn_sender_progress.published_seq");
PXN_STATIC_ASSERT(offsetof(pxn_sender_progress, reaped_seq) == 16, "pxn_sender_progress.reaped_seq");
PXN_STATIC_ASSERT(offsetof(pxn_sender_progress, pad0) == 24, "pxn_sender_progress.pad0");
PXN_STATIC_ASSERT(sizeof(pxn_sender_progress) == 64, "sizeof pxn_sender_progress");

PXN_STATIC_ASSERT(offsetof(pxn_relay_progress, completed_seq) == 0, "pxn_relay_progress.completed_seq");
PXN_STATIC_ASSERT(offsetof(pxn_relay_progress, open_epoch) == 8, "pxn_relay_progress.open_epoch");
PXN_STATIC_ASSERT(offsetof(pxn_relay_progress, pad0) == 16, "pxn_relay_progress.pad0");
PXN_STATIC_ASSERT(sizeof(pxn_relay_progress) == 64, "sizeof pxn_relay_progress");

PXN_STATIC_ASSERT(offsetof(pxn_relay_wake, sleeping) == 0, "pxn_relay_wake.sleeping");
PXN_STATIC_ASSERT(offsetof(pxn_relay_wake, pad0) == 4, "pxn_relay_wake.pad0");
PXN_STATIC_ASSERT(sizeof(pxn_relay_wake) == 64, "sizeof pxn_relay_wake");

PXN_STATIC_ASSERT(offsetof(pxn_lane_sender_block, sender) == 0, "pxn_lane_sender_block.sender");
PXN_STATIC_ASSERT(offsetof(pxn_lane_sender_block, ready) == 64, "pxn_lane_sender_block.ready");
PXN_STATIC_ASSERT(offsetof(pxn_lane_sender_block, descs) == 1216, "pxn_lane_sender_block.descs");
PXN_STATIC_ASSERT(sizeof(pxn_lane_sender_block) == 1186624, "sizeof pxn_lane_sender_block");

PXN_STATIC_ASSERT(offsetof(pxn_lane_relay_block, relay) == 0, "pxn_lane_relay_block.relay");
PXN_STATIC_ASSERT(offsetof(pxn_lane_relay_block, wake) == 64, "pxn_lane_relay_block.wake");
PXN_STATIC_ASSERT(offsetof(pxn_lane_relay_block, completions) == 128, "pxn_lane_relay_block.completions");
PXN_STATIC_ASSERT(sizeof(pxn_lane_relay_block) == 1280, "sizeof pxn_lane_relay_block");

PXN_STATIC_ASSERT(offsetof(pxn_lane_summary, owner) == 0, "pxn_lane_summary.owner");
PXN_STATIC_ASSERT(offsetof(pxn_lane_summary, sender) == 64, "pxn_lane_summary.sender");
PXN_STATIC_ASSERT(offsetof(pxn_lane_summary, relay) == 128, "pxn_lane_summary.relay");
PXN_STATIC_ASSERT(sizeof(pxn_lane_summary) == 192, "sizeof pxn_lane_summary");

PXN_STATIC_ASSERT(offsetof(pxn_header, magic) == 0, "pxn_header.magic");
PXN_STATIC_ASSERT(offsetof(pxn_header, abi_version) == 8, "pxn_header.abi_version");
PXN_STATIC_ASSERT(offsetof(pxn_header, header_size) == 12, "pxn_header.header_size");
PXN_STATIC_ASSERT(offsetof(pxn_header, state) == 16, "pxn_header.state");
PXN_STATIC_ASSERT(offsetof(pxn_header, uid) == 20, "pxn_header.uid");
PXN_STATIC_ASSERT(offsetof(pxn_header, pid) == 24, "pxn_header.pid");
PXN_STATIC_ASSERT(offsetof(pxn_header, start_time) == 32, "pxn_header.start_time");
PXN_STATIC_ASSERT(offsetof(pxn_header, boot_epoch) == 40, "pxn_header.boot_epoch");
PXN_STATIC_ASSERT(offsetof(pxn_header, lane_count) == 48, "pxn_header.lane_count");
PXN_STATIC_ASSERT(offsetof(pxn_header, slots_per_lane) == 52, "pxn_header.slots_per_lane");
PXN_STATIC_ASSERT(offsetof(pxn_header, slot_size) == 56, "pxn_header.slot_size");
PXN_STATIC_ASSERT(offsetof(pxn_header, arena_size) == 64, "pxn_header.arena_size");
PXN_STATIC_ASSERT(offsetof(pxn_header, arena_kind) == 72, "pxn_header.arena_kind");
PXN_STATIC_ASSERT(offsetof(pxn_header, rail_len) == 76, "pxn_header.rail_len");
PXN_STATIC_ASSERT(offsetof(pxn_header, rail) == 80, "pxn_header.rail");
PXN_STATIC_ASSERT(offsetof(pxn_header, hca_len) == 128, "pxn_header.hca_len");
PXN_STATIC_ASSERT(offsetof(pxn_header, arena_shares) == 132, "pxn_header.arena_shares");
PXN_STATIC_ASSERT(offsetof(pxn_header, hca) == 136, "pxn_header.hca");
PXN_STATIC_ASSERT(offsetof(pxn_header, ipc_handle) == 192, "pxn_header.ipc_handle");
PXN_STATIC_ASSERT(offsetof(pxn_header, heartbeat) == 256, "pxn_header.heartbeat");
PXN_STATIC_ASSERT(offsetof(pxn_header, pad0) == 264, "pxn_header.pad0");
PXN_STATIC_ASSERT(offsetof(pxn_header, pid_ns_dev) == 384, "pxn_header.pid_ns_dev");
PXN_STATIC_ASSERT(offsetof(pxn_header, pid_ns_ino) == 392, "pxn_header.pid_ns_ino");
PXN_STATIC_ASSERT(offsetof(pxn_header, pad1) == 400, "pxn_header.pad1");
PXN_STATIC_ASSERT(sizeof(pxn_header) == 448, "sizeof pxn_header");

PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, gen) == 0, "pxn_rank_stats.gen");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, updated_at) == 8, "pxn_rank_stats.updated_at");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, relayed_bytes) == 16, "pxn_rank_stats.relayed_bytes");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, relayed_pieces) == 24, "pxn_rank_stats.relayed_pieces");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, forwarded_bytes) == 32, "pxn_rank_stats.forwarded_bytes");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, forwarded_pieces) == 40, "pxn_rank_stats.forwarded_pieces");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, direct_bytes) == 48, "pxn_rank_stats.direct_bytes");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, failed_pieces) == 56, "pxn_rank_stats.failed_pieces");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, second_hop_failures) == 64, "pxn_rank_stats.second_hop_failures");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, invalid_descs) == 72, "pxn_rank_stats.invalid_descs");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, credit_waits) == 80, "pxn_rank_stats.credit_waits");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, lane_quarantines) == 88, "pxn_rank_stats.lane_quarantines");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, pump_cpu_nanos) == 96, "pxn_rank_stats.pump_cpu_nanos");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, outbound_lanes) == 104, "pxn_rank_stats.outbound_lanes");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, inbound_lanes) == 108, "pxn_rank_stats.inbound_lanes");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, fallback_bytes) == 112, "pxn_rank_stats.fallback_bytes");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, fallback_pieces) == 176, "pxn_rank_stats.fallback_pieces");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, device_len) == 240, "pxn_rank_stats.device_len");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, pad0) == 244, "pxn_rank_stats.pad0");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, device) == 248, "pxn_rank_stats.device");
PXN_STATIC_ASSERT(offsetof(pxn_rank_stats, pad1) == 296, "pxn_rank_stats.pad1");
PXN_STATIC_ASSERT(sizeof(pxn_rank_stats) == 384, "sizeof pxn_rank_stats");

PXN_STATIC_ASSERT(offsetof(pxn_control_block, header) == 0, "pxn_control_block.header");
PXN_STATIC_ASSERT(offsetof(pxn_control_block, stats) == 448, "pxn_control_block.stats");
PXN_STATIC_ASSERT(offsetof(pxn_control_block, lanes) == 832, "pxn_control_block.lanes");
PXN_STATIC_ASSERT(sizeof(pxn_control_block) == 2176, "sizeof pxn_control_block");

PXN_STATIC_ASSERT(PXN_ARENA_SIZE == (UINT64_C(1008) << 20), "arena size");
PXN_STATIC_ASSERT(PXN_SLOT_OF(1) == 0, "seq 1 is slot 0");
PXN_STATIC_ASSERT(PXN_SLOT_OF(19) == 0, "seq 19 reuses slot 0");
PXN_STATIC_ASSERT(PXN_SLOT_OF(18) == 17, "seq 18 is the last slot");

#endif
