# SPDX-License-Identifier: Apache-2.0
"""mooncake.engine from the installed wheel, called as SGLang's
disaggregation backend calls it (MooncakeTransferEngine): initialize with
P2PHANDSHAKE, get_rpc_port for the session name, register_memory and
batch_register_memory, transfer_sync_write and batch_transfer_sync_write,
and the unregister pair; each process of a deployment is a peer process."""

import hashlib
import os
import sys
import time
import uuid

import pytest
from peer import pattern

HOST = "127.0.0.1"
KIB = 1024


def expect(data):
    return hashlib.sha256(data).hexdigest()


def test_module_is_the_installed_wheel(peers):
    p = peers("probe")
    ans = p.call("probe")
    assert os.path.commonpath([ans["module"], sys.prefix]) == sys.prefix, (
        f"mooncake.engine came from {ans['module']}, not from the environment at {sys.prefix}"
    )
    assert not ans["libpxn_mapped"], "importing mooncake.engine loaded libpxn.so"


@pytest.mark.parametrize("protocol", ["tcp", "rdma"])
def test_sglang_sequence_over_tcp_pxn_off(peers, record_property, protocol):
    """MC_PXN_ENABLE=0: the decode side registers its KV buffers in one batch,
    the prefill side registers its source and writes one whole buffer, then
    scattered 4 KiB blocks in one batch; every byte of the target is checked,
    those no write covers included (still zero). With protocol "rdma", what
    SGLang passes, Mooncake finds no RDMA device and installs TCP."""
    target = peers("decode", MC_PXN_ENABLE="0")
    source = peers("prefill", MC_PXN_ENABLE="0")
    ports = {}
    for name, p in (("decode", target), ("prefill", source)):
        ans = p.call("init", host=HOST, metadata="P2PHANDSHAKE", protocol=protocol, device="")
        assert ans["rc"] == 0, f"{name}: initialize returned {ans['rc']}\n{p.stderr()[-4000:]}"
        assert ans["port"] > 0
        ports[name] = ans["port"]
    session = f"{HOST}:{ports['decode']}"

    layers, size, block = 4, 256 * KIB, 4 * KIB
    kv = [target.call("alloc", name=f"kv{i}", size=size)["addr"] for i in range(layers)]
    assert target.call("batch_register", addrs=kv, sizes=[size] * layers)["rc"] == 0
    src = source.call("alloc", name="src", size=layers * size, seed="src")["addr"]
    assert source.call("register", addr=src, size=layers * size)["rc"] == 0
    data = pattern("src", layers * size)

    rc = source.call("write", session=session, src=src, dst=kv[0], size=size)["rc"]
    assert rc == 0, f"transfer_sync_write returned {rc}\n{source.stderr()[-4000:]}"

    srcs, dsts, lens = [], [], []
    for layer in range(1, layers):
        for off in range(0, size, 2 * block):
            srcs.append(src + layer * size + off)
            dsts.append(kv[layer] + off)
            lens.append(block)
    rc = source.call("batch_write", session=session, srcs=srcs, dsts=dsts, sizes=lens)["rc"]
    assert rc == 0, f"batch_transfer_sync_write returned {rc}\n{source.stderr()[-4000:]}"

    checked = 0
    blocks = [(o, block) for o in range(0, size, block)]
    for layer in range(layers):
        got = target.call("digests", name=f"kv{layer}", blocks=blocks)["digests"]
        for (off, n), digest in zip(blocks, got):
            written = layer == 0 or off % (2 * block) == 0
            want = data[layer * size + off:layer * size + off + n] if written else bytes(n)
            assert digest == expect(want), (
                f"kv{layer} bytes {off}..{off + n}: {'not the source' if written else 'written, though no write covers them'}"
            )
            checked += n
    record_property("bytes_checked", checked)
    record_property("batch_writes", len(srcs))

    for name, p in (("decode", target), ("prefill", source)):
        assert not p.call("probe")["libpxn_mapped"], f"{name} loaded libpxn.so with MC_PXN_ENABLE=0"
    assert source.call("unregister", addr=src)["rc"] == 0
    assert target.call("batch_unregister", addrs=kv)["rc"] == 0


def test_pxn_on_without_rdma_device(peers):
    """MC_PXN_ENABLE=1 and the RDMA transport (MC_FORCE_HCA=1 makes Mooncake
    install it, as a discovered NIC would) where no RDMA device exists:
    initialize returns Mooncake's error, the process goes on, and once the
    engine is dropped none of PXN is left: no thread beyond those the process
    had before, libpxn.so (and so its staging arena) not loaded, no registry
    file of the group."""
    group = f"pytest-{uuid.uuid4().hex[:12]}"
    p = peers(
        "rank",
        MC_PXN_ENABLE="1",
        MC_FORCE_HCA="1",
        MC_PXN_GROUP_ID=group,
        MC_PXN_RAIL_MAP='{"mlx5_0":"rail0","mlx5_1":"rail1"}',
    )
    before = p.call("probe")
    ans = p.call("init", host=HOST, metadata="P2PHANDSHAKE", protocol="rdma", device="mlx5_0")
    assert ans["rc"] != 0, "initialize succeeded on a machine without an RDMA device"
    log = p.stderr()
    assert "No available RNIC" in log, f"initialize failed, but not with Mooncake's error:\n{log[-4000:]}"
    after = p.call("drop")
    # A thread the engine stopped without joining may still be exiting when
    # drop answers.
    deadline = time.monotonic() + 10
    while True:
        left = sorted(set(after["threads"]) - set(before["threads"]), key=int)
        if not left or time.monotonic() > deadline:
            break
        after = p.call("probe")
    assert not left, f"threads {left} outlive the engine (before: {before['threads']})"
    assert not after["libpxn_mapped"], "libpxn.so is loaded after initialize failed"
    leftovers = [n for n in os.listdir("/dev/shm") if group in n]
    assert not leftovers, f"/dev/shm holds {leftovers} of group {group}"
