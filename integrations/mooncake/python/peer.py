# SPDX-License-Identifier: Apache-2.0
"""One process of a Mooncake deployment, driven by the tests line by line: a
JSON request on stdin, a JSON answer on stdout. It calls mooncake.engine the
way SGLang's and vLLM's Mooncake backends do; buffers are host memory from
ctypes, owned by this process until it exits."""

import ctypes
import gc
import hashlib
import json
import os
import sys
import threading


def pattern(seed, size):
    """The bytes a source buffer of seed holds: a SHAKE-256 stream, so that a
    block written to the wrong place or offset shows."""
    return hashlib.shake_256(str(seed).encode()).digest(size)


def threads():
    return sorted(os.listdir("/proc/self/task"), key=int)


def mapped(name):
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith("/" + name) for line in maps)


class Peer:
    def __init__(self):
        self.engine = None
        self.buffers = {}
        self.pending = None

    def probe(self):
        import mooncake.engine

        return {
            "threads": threads(),
            "libpxn_mapped": mapped("libpxn.so"),
            "module": mooncake.engine.__file__,
        }

    def init(self, host, metadata, protocol, device):
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        rc = self.engine.initialize(host, metadata, protocol, device)
        port = self.engine.get_rpc_port() if rc == 0 else 0
        return {"rc": rc, "port": port}

    def drop(self):
        self.engine = None
        gc.collect()
        return self.probe()

    def alloc(self, name, size, seed=None):
        buf = ctypes.create_string_buffer(size)
        if seed is not None:
            ctypes.memmove(buf, pattern(seed, size), size)
        self.buffers[name] = buf
        return {"addr": ctypes.addressof(buf)}

    def register(self, addr, size):
        return {"rc": self.engine.register_memory(addr, size)}

    def batch_register(self, addrs, sizes):
        return {"rc": self.engine.batch_register_memory(addrs, sizes)}

    def unregister(self, addr):
        return {"rc": self.engine.unregister_memory(addr)}

    def batch_unregister(self, addrs):
        return {"rc": self.engine.batch_unregister_memory(addrs)}

    def write(self, session, src, dst, size):
        return {"rc": self.engine.transfer_sync_write(session, src, dst, size)}

    def batch_write(self, session, srcs, dsts, sizes, hint=None):
        if hint is None:
            return {"rc": self.engine.batch_transfer_sync_write(session, srcs, dsts, sizes)}
        return {"rc": self.engine.batch_transfer_sync_write(session, srcs, dsts, sizes, hint)}

    def time_batch_write(self, session, srcs, dsts, sizes, calls):
        """calls batch_transfer_sync_write calls, each timed alone (ns)."""
        import time

        took = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            rc = self.engine.batch_transfer_sync_write(session, srcs, dsts, sizes)
            took.append(time.perf_counter_ns() - start)
            if rc != 0:
                raise RuntimeError(f"batch_transfer_sync_write returned {rc}")
        return {"ns": took}

    def batch_write_start(self, session, srcs, dsts, sizes):
        """batch_transfer_sync_write on a thread of its own, as a serving
        engine's sender thread calls it; batch_write_join returns its result."""
        result = {}

        def run():
            try:
                result["rc"] = self.engine.batch_transfer_sync_write(session, srcs, dsts, sizes)
            except Exception as e:  # reported by batch_write_join
                result["error"] = f"{type(e).__name__}: {e}"

        self.pending = (threading.Thread(target=run), result)
        self.pending[0].start()
        return {}

    def batch_write_join(self, seconds):
        thread, result = self.pending
        thread.join(seconds)
        if thread.is_alive():
            raise TimeoutError(f"batch_transfer_sync_write still running after {seconds} s")
        self.pending = None
        if "error" in result:
            raise RuntimeError(result["error"])
        return result

    def seam(self, action, n=0):
        """The emulated NIC of a test build of the module linked against the
        link seam (integrations/mooncake/test/rdma_seam.cpp): hold, release
        or count what it holds."""
        import mooncake.engine

        lib = ctypes.CDLL(mooncake.engine.__file__)
        if action == "hold":
            lib.pxn_seam_hold()
        elif action == "release":
            lib.pxn_seam_release(ctypes.c_size_t(n))
        lib.pxn_seam_held.restype = ctypes.c_size_t
        return {"held": lib.pxn_seam_held()}

    def digests(self, name, blocks):
        """SHA-256 of each (offset, size) block of buffer name."""
        data = bytes(self.buffers[name])
        return {"digests": [hashlib.sha256(data[o:o + n]).hexdigest() for o, n in blocks]}


def main():
    peer = Peer()
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        if op == "exit":
            break
        try:
            ans = getattr(peer, op)(**req)
            ans["ok"] = True
        except Exception as e:  # the test reads the failure; the peer goes on
            ans = {"ok": False, "error": f"{op}: {type(e).__name__}: {e}"}
        print(json.dumps(ans), flush=True)


if __name__ == "__main__":
    main()
