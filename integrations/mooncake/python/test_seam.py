# SPDX-License-Identifier: Apache-2.0
"""SGLang's and vLLM's calls with MC_PXN_ENABLE=1, through a test build of
mooncake.engine linked against the link seam (test/module-seam.sh): the
module is Mooncake's own (TransferEngine, the P2P handshake over loopback,
TransferMetadata, MultiTransport with PXN's transport, libpxn.so of the
wheel) except RdmaTransport, which is the seam's emulated NIC. That NIC
writes into the target process's memory with process_vm_writev.

Four processes stand for the ranks of one node, GPU i with NIC mlx5_i on
rail i (one rail map, one group ID, one registry); a fifth is the decode
side on another node, its KV buffers behind its NIC mlx5_1, on rail 1.

No GPU here: every buffer is host memory. The transport relays only
sources it classifies as device memory, by the location Mooncake gives a
registration: Mooncake asks the memory (cuda:N for GPU memory), the seam
answers cuda:0 for a rank's host buffers (SEAM_WILDCARD_LOCATION), as the
C++ seam tests register host buffers as cuda:0. Topology discovery finds no
NIC here either: each rank's topology is the one its device argument
selects, handed to Mooncake as MC_CUSTOM_TOPO_JSON.

Counters are each rank's own, read from its counters block in the registry
with pxn-agent inspect (PXN_AGENT), as an operator reads them."""

import ctypes
import hashlib
import importlib.util
import json
import os
import subprocess
import time
import uuid

import pytest
from peer import pattern

HOST = "127.0.0.1"
KIB = 1024
MIB = 1024 * KIB
NICS = [f"mlx5_{i}" for i in range(4)]
RAIL_MAP = {nic: f"rail{i}" for i, nic in enumerate(NICS)}
DECODE_NIC = "mlx5_1"


def _seam_build():
    origin = importlib.util.find_spec("mooncake.engine").origin
    return hasattr(ctypes.CDLL(origin), "pxn_seam_hold")


pytestmark = [
    pytest.mark.skipif(not _seam_build(), reason="mooncake.engine is not a build against the link seam (test/module-seam.sh)"),
    pytest.mark.skipif(not os.environ.get("PXN_AGENT"), reason="PXN_AGENT does not name a pxn-agent binary to read the counters with"),
]


def ib_device_for_gpu(spec, gpu):
    """The device SGLang passes to initialize for GPU gpu, from the forms
    --disaggregation-ib-device takes: a comma-separated list for every GPU,
    a JSON object from GPU index to devices, or the path of a .json file
    holding one."""
    spec = spec.strip()
    if spec.endswith(".json"):
        with open(spec) as f:
            spec = f.read().strip()
    try:
        by_gpu = json.loads(spec)
    except ValueError:
        return spec
    if not isinstance(by_gpu, dict) or str(gpu) not in by_gpu:
        raise ValueError(f"no IB device for GPU {gpu} in {spec!r}")
    return by_gpu[str(gpu)].strip()


def expect(data):
    return hashlib.sha256(data).hexdigest()


def eventually(what, probe, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class Cluster:
    """The processes of one test: ranks of the node, the decode side, the
    registry they share and the counters read from it."""

    def __init__(self, peers, tmp_path):
        self.peers = peers
        self.tmp = tmp_path
        self.group = f"pytest-{uuid.uuid4().hex[:12]}"
        self.registry = tmp_path / "registry"
        self.registry.mkdir()
        (tmp_path / "peers").mkdir()
        self.ports = {}

    def start(self, name, device, pxn=True, device_memory=True, **extra):
        """A process whose topology is the NICs device names; a rank of the
        node (pxn) has PXN on and its buffers in "GPU" memory."""
        nics = [d.strip() for d in device.split(",") if d.strip()]
        locations = {"cpu:0": [nics, []]}
        if device_memory:
            locations["cuda:0"] = [nics, []]
        topology = self.tmp / f"{name}.topology.json"
        topology.write_text(json.dumps(locations))
        env = dict(MC_CUSTOM_TOPO_JSON=str(topology), SEAM_PEERS=str(self.tmp / "peers"))
        if device_memory:
            env["SEAM_WILDCARD_LOCATION"] = "cuda:0"
        if pxn:
            env.update(
                MC_PXN_ENABLE="1",
                MC_PXN_GROUP_ID=self.group,
                MC_PXN_REGISTRY_ROOT=str(self.registry),
                MC_PXN_RAIL_MAP=json.dumps(RAIL_MAP),
            )
        else:
            env["MC_PXN_ENABLE"] = "0"
        env.update(extra)
        return self.peers(name, **env)

    def init(self, p, device):
        ans = p.call("init", host=HOST, metadata="P2PHANDSHAKE", protocol="rdma", device=device)
        assert ans["rc"] == 0, f"{p.name}: initialize returned {ans['rc']}\n{p.stderr()[-4000:]}"
        assert ans["port"] > 0
        self.ports[p.name] = ans["port"]
        return f"{HOST}:{ans['port']}"

    def report(self, p):
        """p's rank in the registry, as pxn-agent inspect shows it."""
        out = subprocess.run(
            [os.environ["PXN_AGENT"], "inspect", "--root", str(self.registry), "-o", "json"],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, f"pxn-agent inspect: {out.stderr}"
        for group in json.loads(out.stdout):
            for rank in group["ranks"]:
                if rank["pid"] == p.pid:
                    return rank
        return None

    def lanes(self, senders, relay, outbound):
        """Waits until each sender owns a lane at relay and has published
        (in its counters, once a heartbeat) outbound lanes, one a rail of
        the node's other ranks: its writes to those rails take PXN's path
        from then on."""
        def probe():
            rank = self.report(relay)
            owners = {lane["owner_pid"] for lane in (rank or {}).get("lanes", [])}
            return all(s.pid in owners and self.stats(s)["outbound_lanes"] == outbound for s in senders)
        eventually(f"{[s.name for s in senders]} to hold {outbound} lanes, one at {relay.name}", probe)

    def stats(self, p):
        rank = self.report(p)
        assert rank is not None, f"{p.name} (pid {p.pid}) is no rank of the registry"
        assert rank.get("stats"), f"{p.name}'s counters are unreadable: {rank.get('stats_error')}"
        return rank["stats"]

    def settled(self, p, moved):
        """p's counters once the pump has published at least moved bytes
        relayed, sent direct by PXN or fallen back."""
        def probe():
            s = self.stats(p)
            done = s["relayed_bytes"] + s["direct_bytes"] + sum(s["fallback_bytes"].values())
            return s if s["published"] and done >= moved else None
        return eventually(f"{p.name}'s counters to account for {moved} bytes", probe)

    def forwarded(self, p, n):
        """p's counters once its pump has published at least n bytes
        forwarded for its peers: a relay publishes at its own heartbeat, so
        its count can trail the senders' by one."""
        def probe():
            s = self.stats(p)
            return s if s["published"] and s["forwarded_bytes"] >= n else None
        return eventually(f"{p.name}'s counters to show {n} bytes forwarded", probe)


def fallback(s):
    return sum(s["fallback_bytes"].values())


def check_blocks(target, name, blocks, source, written):
    """Every (offset, size) block of target's buffer name holds the source's
    bytes at the same offset when written says so, else zeros; returns the
    bytes checked."""
    got = target.call("digests", name=name, blocks=blocks)["digests"]
    for (off, n), digest in zip(blocks, got):
        want = source[off:off + n] if written(off) else bytes(n)
        assert digest == expect(want), (
            f"{name} bytes {off}..{off + n}: {'not the source' if written(off) else 'written, though no write covers them'}"
        )
    return sum(n for _, n in blocks)


def test_sglang_sequence_relayed(peers, tmp_path, record_property):
    """SGLang's calls (MooncakeTransferEngine of its disaggregation backend)
    with PXN on: rank 0 (rail 0) and rank 2 (rail 2) write the decode
    side's KV buffers behind mlx5_1 (rail 1) through rank 1, the relay of
    rail 1: register_memory, transfer_sync_write of a whole buffer,
    batch_transfer_sync_write of scattered 4 KiB blocks (once with the
    trailing transport_hint), unregister_memory. Every byte of the target is
    checked; the senders' relayed bytes are what they wrote, with no
    fallback, and the relay forwarded as much. Rank 1's own write to the
    decode side is same-rail: it lands, and PXN neither relays nor forwards
    it."""
    c = Cluster(peers, tmp_path)
    # The node's GPU-to-NIC map as --disaggregation-ib-device takes it:
    # inline JSON for ranks 0 and 1, a .json file for ranks 2 and 3; the
    # decode node names its one device.
    by_gpu = json.dumps({str(i): nic for i, nic in enumerate(NICS)})
    by_gpu_file = tmp_path / "ib_devices.json"
    by_gpu_file.write_text(by_gpu)
    specs = [by_gpu, by_gpu, str(by_gpu_file), str(by_gpu_file)]
    devices = [ib_device_for_gpu(spec, gpu) for gpu, spec in enumerate(specs)]
    assert devices == NICS
    decode_device = ib_device_for_gpu(DECODE_NIC, 0)

    target = c.start("decode", decode_device, pxn=False, device_memory=False)
    ranks = [c.start(f"rank{i}", dev) for i, dev in enumerate(devices)]
    session = c.init(target, decode_device)
    for p, dev in zip(ranks, devices):
        c.init(p, dev)
    c.lanes([ranks[0], ranks[2]], ranks[1], len(ranks) - 1)

    layers, size, block = 4, 256 * KIB, 4 * KIB
    kv = [target.call("alloc", name=f"kv{i}", size=size)["addr"] for i in range(layers)]
    assert target.call("batch_register", addrs=kv, sizes=[size] * layers)["rc"] == 0

    # Rank 0 writes layer 0 whole and the even blocks of layers 1 and 2;
    # rank 2 the odd blocks of layer 2; rank 1 (same rail) layer 3.
    data = pattern("sglang", layers * size)
    srcs = {}
    for i in (0, 1, 2):
        srcs[i] = ranks[i].call("alloc", name="src", size=layers * size, seed="sglang")["addr"]
        assert ranks[i].call("register", addr=srcs[i], size=layers * size)["rc"] == 0

    def blocks(i, layer, parity):
        return [(srcs[i] + layer * size + off, kv[layer] + off, block)
                for off in range(parity * block, size, 2 * block)]

    rc = ranks[0].call("write", session=session, src=srcs[0], dst=kv[0], size=size)["rc"]
    assert rc == 0, f"transfer_sync_write returned {rc}\n{ranks[0].stderr()[-4000:]}"
    for i, parts, hint in ((0, blocks(0, 1, 0) + blocks(0, 2, 0), None), (2, blocks(2, 2, 1), "")):
        s, d, n = (list(x) for x in zip(*parts))
        rc = ranks[i].call("batch_write", session=session, srcs=s, dsts=d, sizes=n, hint=hint)["rc"]
        assert rc == 0, f"rank {i}: batch_transfer_sync_write returned {rc}\n{ranks[i].stderr()[-4000:]}"
    sent = {0: size + 2 * (size // 2), 2: size // 2}
    stats = {i: c.settled(ranks[i], sent[i]) for i in (0, 2)}
    relay_before = c.forwarded(ranks[1], sent[0] + sent[2])

    rc = ranks[1].call("write", session=session, src=srcs[1] + 3 * size, dst=kv[3], size=size)["rc"]
    assert rc == 0, f"rank 1's same-rail transfer_sync_write returned {rc}\n{ranks[1].stderr()[-4000:]}"

    checked = 0
    all_blocks = [(o, block) for o in range(0, size, block)]
    written = {
        0: lambda off: True,
        1: lambda off: off % (2 * block) == 0,
        2: lambda off: True,
        3: lambda off: True,
    }
    for layer in range(layers):
        checked += check_blocks(target, f"kv{layer}", all_blocks, data[layer * size:(layer + 1) * size], written[layer])

    for i in (0, 2):
        s = stats[i]
        assert s["relayed_bytes"] == sent[i], f"rank {i} relayed {s['relayed_bytes']} bytes, wrote {sent[i]} across rails"
        assert fallback(s) == 0 and s["failed_pieces"] == 0, f"rank {i}: fallback {s['fallback_bytes']}, failed Pieces {s['failed_pieces']}"
    relay = c.stats(ranks[1])
    assert relay["forwarded_bytes"] == sent[0] + sent[2], (
        f"rank 1 forwarded {relay['forwarded_bytes']} bytes, its peers relayed {sent[0] + sent[2]}"
    )
    assert relay["forwarded_bytes"] == relay_before["forwarded_bytes"], "rank 1 forwarded its own same-rail write"
    assert relay["relayed_bytes"] == 0 and fallback(relay) == 0, f"rank 1's same-rail write went through PXN: {relay}"
    for i in (0, 2, 3):
        assert c.stats(ranks[i])["forwarded_bytes"] == 0, f"rank {i} forwarded bytes"

    record_property("relayed_bytes", sent[0] + sent[2])
    record_property("fallback_bytes", 0)
    record_property("bytes_checked", checked)

    for i in (0, 1, 2):
        assert ranks[i].call("unregister", addr=srcs[i])["rc"] == 0
    assert target.call("batch_unregister", addrs=kv)["rc"] == 0


def contiguous_runs(local, remote):
    """Pairs of local and remote block ids cut where either stops being
    consecutive, as vLLM's connector groups them into one write each."""
    runs = [([local[0]], [remote[0]])]
    for lo, re in zip(local[1:], remote[1:]):
        if lo == runs[-1][0][-1] + 1 and re == runs[-1][1][-1] + 1:
            runs[-1][0].append(lo)
            runs[-1][1].append(re)
        else:
            runs.append(([lo], [re]))
    return runs


def test_vllm_sequence_relayed(peers, tmp_path, record_property):
    """vLLM's Mooncake connector with PXN on: each worker initializes with
    P2PHANDSHAKE, protocol rdma and no device (the process's topology is
    restricted to the NIC nearest its GPU, as PXN needs one NIC a process),
    registers its per-layer KV caches with batch_register_memory, and the
    prefill worker (rank 0, rail 0) sends a request's blocks, grouped into
    contiguous runs per layer, with one batch_transfer_sync_write to the
    decode worker behind mlx5_1 (rail 1), through rank 1. The destination's
    blocks are checked, those of the request and the others (still zero);
    rank 0 relayed every byte, none fell back."""
    c = Cluster(peers, tmp_path)
    target = c.start("decode", DECODE_NIC, pxn=False, device_memory=False)
    ranks = [c.start(f"rank{i}", nic) for i, nic in enumerate(NICS)]
    session = c.init(target, "")
    for p in ranks:
        c.init(p, "")
    c.lanes([ranks[0]], ranks[1], len(ranks) - 1)

    layers, num_blocks, block_len = 3, 64, 16 * KIB
    size = num_blocks * block_len
    remote = [target.call("alloc", name=f"kv{i}", size=size)["addr"] for i in range(layers)]
    assert target.call("batch_register", addrs=remote, sizes=[size] * layers)["rc"] == 0
    local = [ranks[0].call("alloc", name=f"kv{i}", size=size, seed=f"vllm{i}")["addr"] for i in range(layers)]
    assert ranks[0].call("batch_register", addrs=local, sizes=[size] * layers)["rc"] == 0

    local_ids = [3, 4, 5, 9, 10, 20, 21, 22, 23, 40]
    remote_ids = [7, 8, 9, 10, 11, 30, 31, 50, 51, 52]
    srcs, dsts, lens = [], [], []
    for lbase, rbase in zip(local, remote):
        for lrun, rrun in contiguous_runs(local_ids, remote_ids):
            srcs.append(lbase + lrun[0] * block_len)
            dsts.append(rbase + rrun[0] * block_len)
            lens.append(block_len * len(lrun))
    rc = ranks[0].call("batch_write", session=session, srcs=srcs, dsts=dsts, sizes=lens)["rc"]
    assert rc == 0, f"batch_transfer_sync_write returned {rc}\n{ranks[0].stderr()[-4000:]}"
    moved = sum(lens)
    s = c.settled(ranks[0], moved)

    checked = 0
    source_of = dict(zip(remote_ids, local_ids))
    blocks = [(b * block_len, block_len) for b in range(num_blocks)]
    for layer in range(layers):
        src = pattern(f"vllm{layer}", size)
        got = target.call("digests", name=f"kv{layer}", blocks=blocks)["digests"]
        for b, digest in enumerate(got):
            if b in source_of:
                lo = source_of[b] * block_len
                want, what = src[lo:lo + block_len], f"local block {source_of[b]}"
            else:
                want, what = bytes(block_len), "zeros"
            assert digest == expect(want), f"kv{layer} block {b} is not {what}"
            checked += block_len
    assert s["relayed_bytes"] == moved, f"rank 0 relayed {s['relayed_bytes']} of {moved} bytes"
    assert fallback(s) == 0 and s["failed_pieces"] == 0, f"fallback {s['fallback_bytes']}, failed Pieces {s['failed_pieces']}"
    assert c.forwarded(ranks[1], moved)["forwarded_bytes"] == moved
    record_property("relayed_bytes", moved)
    record_property("fallback_bytes", 0)
    record_property("bytes_checked", checked)
    assert ranks[0].call("batch_unregister", addrs=local)["rc"] == 0
    assert target.call("batch_unregister", addrs=remote)["rc"] == 0


def test_relay_killed_mid_transfer(peers, tmp_path, record_property):
    """SGLang's batch_transfer_sync_write from rank 0 (rail 0) to the decode
    side (rail 1) while rank 1, the relay, holds its NIC: rank 0 fills its
    lane's ring and queues the rest, waiting for credit; rank 1 is killed
    (SIGKILL). Each published write fails once, each queued one goes direct
    once. Mooncake's batch_transfer_sync_write then resubmits the failed
    batch whole, as it does on any failure; with the relay gone the retry
    goes direct, the call returns 0 and every destination byte is the
    source's. Writes are 8 MiB, one staging slot each, so that writes and
    Pieces are one to one."""
    slots = int(os.environ.get("PXN_SLOTS_PER_LANE", "0"))
    assert slots > 0, "PXN_SLOTS_PER_LANE does not say how many slots a lane has"
    queued = 6
    n, piece = slots + queued, 8 * MIB
    c = Cluster(peers, tmp_path)
    # Queued Pieces wait for credit past the kill; the relay is judged gone
    # by its liveness lock, not by its heartbeat.
    target = c.start("decode", DECODE_NIC, pxn=False, device_memory=False)
    sender = c.start("rank0", NICS[0], MC_PXN_CREDIT_TIMEOUT_MS="120000")
    relay = c.start("rank1", NICS[1], MC_PXN_CREDIT_TIMEOUT_MS="120000")
    session = c.init(target, DECODE_NIC)
    c.init(sender, NICS[0])
    c.init(relay, NICS[1])
    c.lanes([sender], relay, 1)

    warm = target.call("alloc", name="warm", size=piece)["addr"]
    dst = target.call("alloc", name="dst", size=n * piece)["addr"]
    assert target.call("batch_register", addrs=[warm, dst], sizes=[piece, n * piece])["rc"] == 0
    src = sender.call("alloc", name="src", size=n * piece, seed="killed")["addr"]
    assert sender.call("register", addr=src, size=n * piece)["rc"] == 0
    assert sender.call("write", session=session, src=src, dst=warm, size=piece)["rc"] == 0
    before = c.settled(sender, piece)
    assert before["relayed_bytes"] == piece, f"the first write was not relayed: {before}"

    assert relay.call("seam", action="hold")["held"] == 0
    sender.call("batch_write_start", session=session,
                srcs=[src + i * piece for i in range(n)],
                dsts=[dst + i * piece for i in range(n)],
                sizes=[piece] * n)

    def ring_full():
        rank = c.report(relay)
        for lane in (rank or {}).get("lanes", []):
            if lane["owner_pid"] == sender.pid and lane["published_seq"] - lane["reaped_seq"] == slots:
                return lane
        return None

    lane = eventually("rank 0's ring at rank 1 full", ring_full)
    published = lane["published_seq"] - lane["completed_seq"]
    relay.kill()

    rc = sender.call("batch_write_join", timeout=150, seconds=120)["rc"]
    assert rc == 0, f"batch_transfer_sync_write returned {rc} though its retry had no relay to wait for\n{sender.stderr()[-4000:]}"

    def accounted():
        s = c.stats(sender)
        done = s["failed_pieces"] + s["fallback_pieces"]["relay_gone"] >= n
        return s if done and s["direct_bytes"] - before["direct_bytes"] >= n * piece else None

    s = eventually("every write failed, fell back or was retried", accounted, timeout=60)
    assert s["failed_pieces"] == published == slots, (
        f"{s['failed_pieces']} Pieces failed; {published} were published, the ring has {slots} slots"
    )
    assert s["fallback_pieces"]["relay_gone"] == queued and fallback(s) == queued * piece, (
        f"fallback {s['fallback_pieces']} Pieces, {s['fallback_bytes']} bytes; want {queued} of {piece} bytes, the relay gone"
    )
    assert s["direct_bytes"] - before["direct_bytes"] == n * piece, (
        f"{s['direct_bytes'] - before['direct_bytes']} bytes sent direct, want the retried batch's {n * piece}"
    )
    assert s["relayed_bytes"] == before["relayed_bytes"], "a write was relayed after the relay held its NIC"

    data = pattern("killed", n * piece)
    checked = check_blocks(target, "dst", [(i * piece, piece) for i in range(n)], data, lambda off: True)
    record_property("failed_pieces", s["failed_pieces"])
    record_property("fallback_pieces", s["fallback_pieces"]["relay_gone"])
    record_property("retried_direct_bytes", n * piece)
    record_property("bytes_checked", checked)
