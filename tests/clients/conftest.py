"""pytest fixtures: a real holdfast daemon on 127.0.0.1 port 0, stopped by its PID.

HOLDFAST_BIN names the binary (`make test-clients` points it at the release build). The daemon
prints "holdfast: memcache listening on ADDR" for each listener; the fixture reads that line
(with a deadline) to learn the port the kernel picked.
"""

import os
import queue
import re
import subprocess
import threading

import pytest

# How long the daemon may take to print its listening line, and to exit after SIGTERM.
START_TIMEOUT_S = 10
STOP_TIMEOUT_S = 10
# Socket timeout for every client in these tests: a correct daemon answers in microseconds.
CLIENT_TIMEOUT_S = 5

LISTENING = re.compile(r"^holdfast: (\w+) listening on (\S+):(\d+)\s*$")


class Holdfast:
    def __init__(self, proc, addresses):
        self.proc = proc
        self.addresses = addresses  # {"memcache": ("127.0.0.1", port), ...}

    @property
    def memcache(self):
        return self.addresses["memcache"]

    @property
    def memcache_server(self):
        host, port = self.memcache
        return f"{host}:{port}"


def start_holdfast(*extra, base=None, want=("memcache",)):
    """Start the daemon with `base` flags (default: memcache only) plus `extra`; wait until every
    listener named in `want` has printed its line."""
    binary = os.environ.get("HOLDFAST_BIN")
    if not binary:
        pytest.fail("HOLDFAST_BIN must name the holdfast binary (make test-clients sets it)")
    if base is None:
        base = ["--memcache", "127.0.0.1:0", "--lockd", "off", "--dlock", "off", "--counter", "off",
                "--threads", "2"]
    args = [binary] + list(base)
    proc = subprocess.Popen(list(args) + list(extra), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    lines = queue.Queue()

    def pump():
        # Keep reading so the daemon never blocks on a full stdout pipe.
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    addresses = {}
    try:
        while not all(w in addresses for w in want):
            line = lines.get(timeout=START_TIMEOUT_S)
            if line is None:
                raise RuntimeError(f"holdfast exited with status {proc.wait()} before listening")
            m = LISTENING.match(line)
            if m:
                addresses[m.group(1)] = (m.group(2), int(m.group(3)))
    except BaseException:
        stop_holdfast(proc)
        raise
    return Holdfast(proc, addresses)


def stop_holdfast(proc):
    if proc.poll() is None:
        proc.terminate()  # SIGTERM to this PID only
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def holdfast():
    """A fresh daemon per test (memcache listener only)."""
    daemon = start_holdfast()
    yield daemon
    stop_holdfast(daemon.proc)
    assert daemon.proc.returncode == 0, f"holdfast exited with {daemon.proc.returncode} on SIGTERM"
