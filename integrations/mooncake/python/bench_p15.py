# SPDX-License-Identifier: Apache-2.0
"""P15: what PXN adds to one batch_transfer_sync_write of 256 blocks of
4 KiB (SGLang's call), PXN on against PXN off in the same build, the
module linked against the link seam (test/module-seam.sh), same-rail and
cross-rail. hack/mooncake-p15.sh builds what it needs and runs it.

Two ranks with PXN on (rails 0 and 1, one group) and two with it off send
to one decode side behind mlx5_1 (rail 1): rank 1 same-rail, rank 0
cross-rail (with PXN on through rank 1). The four scenarios take turns, a
few calls each, so that load on the machine falls on all of them alike.
Each call is timed inside its process around the call alone."""

import argparse
import datetime
import os
import pathlib
import platform
import statistics
import sys
import tempfile

from conftest import PeerProcess, peer_env
from test_seam import DECODE_NIC, KIB, NICS, Cluster, fallback


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--block", type=int, default=4 * KIB)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=10, help="calls a scenario makes each round")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    if not os.environ.get("PXN_AGENT"):
        sys.exit("PXN_AGENT must name a pxn-agent binary (the relayed path is checked through its counters)")

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pxn-p15-"))
    started = []

    def start(name, **env):
        p = PeerProcess(name, peer_env(**env), str(tmp))
        started.append(p)
        return p

    try:
        c = Cluster(start, tmp)
        decode = c.start("decode", DECODE_NIC, pxn=False, device_memory=False)
        on = [c.start(f"on{i}", NICS[i]) for i in (0, 1)]
        off = [c.start(f"off{i}", NICS[i], pxn=False) for i in (0, 1)]
        session = c.init(decode, DECODE_NIC)
        for i in (0, 1):
            c.init(on[i], NICS[i])
            c.init(off[i], NICS[i])
        c.lanes([on[0]], on[1], 1)

        span = 2 * args.blocks * args.block
        dst = decode.call("alloc", name="dst", size=span)["addr"]
        assert decode.call("register", addr=dst, size=span)["rc"] == 0
        calls = {}
        rows = [("same-rail", "off", off[1]), ("same-rail", "on", on[1]),
                ("cross-rail", "off", off[0]), ("cross-rail", "on", on[0])]
        for _, _, p in rows:
            src = p.call("alloc", name="src", size=span, seed=p.name)["addr"]
            assert p.call("register", addr=src, size=span)["rc"] == 0
            calls[p.name] = dict(
                session=session,
                srcs=[src + 2 * i * args.block for i in range(args.blocks)],
                dsts=[dst + 2 * i * args.block for i in range(args.blocks)],
                sizes=[args.block] * args.blocks,
            )
            p.call("time_batch_write", calls=args.warmup, **calls[p.name])

        took = {(where, pxn): [] for where, pxn, _ in rows}
        for _ in range(args.rounds):
            for where, pxn, p in rows:
                took[(where, pxn)] += p.call("time_batch_write", calls=args.calls, **calls[p.name])["ns"]

        moved = (args.warmup + args.rounds * args.calls) * args.blocks * args.block
        cross = c.settled(on[0], moved)
        same = c.stats(on[1])
        assert cross["relayed_bytes"] == moved and fallback(cross) == 0, f"cross-rail with PXN on did not relay every byte: {cross}"
        assert same["relayed_bytes"] == 0 and fallback(same) == 0, f"same-rail with PXN on went through PXN: {same}"

        print(f"P15 {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {args.commit}, "
              f"{platform.node()} ({os.cpu_count()} CPUs, host memory, the seam's NIC), "
              f"{args.blocks} x {args.block // KIB} KiB a call, {args.rounds * args.calls} calls a row")
        print(f"{'scenario':<11} {'off p50 us':>10} {'on p50 us':>10} {'added us':>9} {'on/off':>7} {'off p99 us':>11} {'on p99 us':>10}")
        for where in ("same-rail", "cross-rail"):
            o, n = took[(where, "off")], took[(where, "on")]
            po, pn = statistics.median(o) / 1e3, statistics.median(n) / 1e3
            print(f"{where:<11} {po:>10.1f} {pn:>10.1f} {pn - po:>+9.1f} {pn / po:>7.3f} "
                  f"{percentile(o, 0.99) / 1e3:>11.1f} {percentile(n, 0.99) / 1e3:>10.1f}")
    finally:
        for p in started:
            p.close()


if __name__ == "__main__":
    main()
