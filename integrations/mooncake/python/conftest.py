# SPDX-License-Identifier: Apache-2.0
"""Peers: processes running peer.py with the interpreter that runs the tests
(the one the wheel is installed in), each with its own environment."""

import json
import os
import select
import signal
import subprocess
import sys

import pytest

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer.py")


class PeerProcess:
    def __init__(self, name, env, workdir):
        self.name = name
        self.killed = False
        self.stderr_path = os.path.join(workdir, f"{name}.stderr")
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, PEER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            cwd=workdir,
            text=True,
        )

    def stderr(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def call(self, op, timeout=120, **args):
        """Sends one request and returns its answer; a peer that does not
        answer within timeout seconds, dies or reports an exception fails
        the test with its log."""
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            pytest.fail(f"{self.name}: no answer to {op} in {timeout} s\n{self.stderr()[-4000:]}")
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait(timeout=10)
            pytest.fail(f"{self.name}: exited with {rc} during {op}\n{self.stderr()[-4000:]}")
        ans = json.loads(line)
        if not ans.pop("ok"):
            pytest.fail(f"{self.name}: {ans['error']}\n{self.stderr()[-4000:]}")
        return ans

    @property
    def pid(self):
        return self.proc.pid

    def kill(self):
        """SIGKILL, as a crash would end it; the fixture expects its status."""
        self.killed = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        return self.proc.returncode


def peer_env(**settings):
    """This environment without any MC_ setting, with settings added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MC_")}
    env.update(settings)
    return env


@pytest.fixture
def peers(tmp_path):
    """Starts peers; each is stopped at the end of the test, and one that
    exits with a failure status fails the test."""
    started = []

    def start(name, **settings):
        p = PeerProcess(name, peer_env(**settings), str(tmp_path))
        started.append(p)
        return p

    yield start
    bad = []
    for p in started:
        rc = p.close()
        if rc != 0 and not (p.killed and rc == -signal.SIGKILL):
            bad.append(f"{p.name} exited with {rc}\n{p.stderr()[-4000:]}")
    if bad:
        pytest.fail("\n".join(bad))
