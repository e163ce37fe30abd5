"""The admin port read by real consumers: Prometheus's own text parser reads /metrics, and a
headless Chromium renders the status page against a daemon holding locks with waiters.

The browser is the Debian `chromium` package (`make deps-browser` installs it). The screenshot
is kept at target/admin-status.png for a human to look at.
"""

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import CLIENT_TIMEOUT_S, start_holdfast, stop_holdfast

ALL_ON = ["--memcache", "127.0.0.1:0", "--lockd", "127.0.0.1:0", "--dlock", "off", "--counter", "off",
          "--admin", "127.0.0.1:0", "--threads", "2"]
# How long Chromium may take to start, load the page and run its first refresh.
BROWSER_TIMEOUT_S = 60
SCREENSHOT = os.path.join(os.path.dirname(__file__), "..", "..", "target", "admin-status.png")


@pytest.fixture
def daemon():
    d = start_holdfast(base=ALL_ON, want=("memcache", "lockd", "admin"))
    yield d
    stop_holdfast(d.proc)
    assert d.proc.returncode == 0


def url(d, path):
    host, port = d.addresses["admin"]
    return f"http://{host}:{port}{path}"


def fetch(d, path):
    with urllib.request.urlopen(url(d, path), timeout=CLIENT_TIMEOUT_S) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def connect(addr):
    s = socket.create_connection(addr, timeout=CLIENT_TIMEOUT_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exactly(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


def lockd(s, opcode, name):
    """One old-protocol request; returns the reply opcode."""
    payload = name + b"\0"
    s.sendall(struct.pack(">I", (1 << 28) | (opcode << 20) | len(payload)) + payload)
    word = struct.unpack(">I", recv_exactly(s, 4))[0]
    recv_exactly(s, word & 0xFFFFF)
    return (word >> 20) & 0xFF


ACQ, ACQUIRED, ACK = 1, 128, 132


def hold_locks(d):
    """A memcache lock, and a lockd lock with two waiters; returns the sockets (keep them)."""
    mc = connect(d.addresses["memcache"])
    mc.sendall(b"set report 0 0 1\r\nv\r\nlock report\r\n")
    assert recv_exactly(mc, 12) == b"STORED\r\nOK\r\n"
    holder, w1, w2 = (connect(d.addresses["lockd"]) for _ in range(3))
    assert lockd(holder, ACQ, b"nightly-backup") == ACQUIRED
    assert lockd(w1, ACQ, b"nightly-backup") == ACK
    assert lockd(w2, ACQ, b"nightly-backup") == ACK
    return [mc, holder, w1, w2]


def test_prometheus_parses_metrics_with_types_labels_and_histograms(daemon):
    socks = hold_locks(daemon)
    status, ctype, text = fetch(daemon, "/metrics")
    assert status == 200
    assert ctype.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # Every family is typed ("unknown" is what the parser calls an untyped one).
    untyped = sorted(n for n, f in families.items() if f.type not in ("counter", "gauge", "histogram"))
    assert untyped == []
    counters = families["holdfast_counter_acquired"]
    assert counters.type == "counter" and counters.samples[0].name == "holdfast_counter_acquired_total"
    held = {s.labels["table"]: s.value for s in families["holdfast_locks_held"].samples}
    assert families["holdfast_locks_held"].type == "gauge"
    assert held == {"memcache": 1.0, "lockd": 1.0, "dlock": 0.0}
    waiters = {s.labels["table"]: s.value for s in families["holdfast_lock_waiters"].samples}
    assert waiters["lockd"] == 2.0
    # The parser names a counter family without its _total suffix.
    grants = families["holdfast_lock_grants"]
    assert grants.type == "counter"
    assert {s.labels["table"] for s in grants.samples} == {"memcache", "lockd", "dlock"}
    open_conns = {s.labels["listener"]: s.value for s in families["holdfast_open_connections"].samples}
    assert open_conns == {"memcache": 1.0, "lockd": 3.0}
    hist = families["holdfast_lock_request_duration_seconds"]
    assert hist.type == "histogram"
    count = {s.labels["protocol"]: s.value for s in hist.samples if s.name.endswith("_count")}
    assert count["memcache"] == 1.0 and count["lockd"] == 3.0
    buckets = [s for s in hist.samples if s.name.endswith("_bucket") and s.labels["protocol"] == "lockd"]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 3.0
    values = [b.value for b in buckets]
    assert values == sorted(values), "buckets are cumulative"
    for s in socks:
        s.close()


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no chromium: `make deps-browser` installs the Debian package")


def chromium(args, profile):
    base = [find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-quic", f"--user-data-dir={profile}", "--virtual-time-budget=5000"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)


def test_status_page_in_a_headless_browser_shows_holders_and_waiters(daemon):
    socks = hold_locks(daemon)
    holder_addr = "%s:%d" % socks[1].getsockname()
    waiter_addrs = ["%s:%d" % s.getsockname() for s in socks[2:]]
    with tempfile.TemporaryDirectory() as profile:
        run = chromium(["--dump-dom", url(daemon, "/")], profile)
        dom = run.stdout
        assert "<h1>holdfast</h1>" in dom, run.stderr[-2000:]
        assert "live, " in dom, "the page fetched /status.json: " + dom[-3000:]
        assert "nightly-backup" in dom and "report" in dom
        assert holder_addr in dom
        # Both waiters, in their order.
        assert dom.index(waiter_addrs[0]) < dom.index(waiter_addrs[1])
        assert "2: " in dom
        os.makedirs(os.path.dirname(SCREENSHOT), exist_ok=True)
        # A phone-sized window: the layout must hold at 412 px.
        shot = chromium(["--window-size=412,915", f"--screenshot={SCREENSHOT}", url(daemon, "/")], profile)
        assert os.path.getsize(SCREENSHOT) > 5000, shot.stderr[-2000:]
    for s in socks:
        s.close()


def test_status_json_matches_the_lock_listing(daemon):
    socks = hold_locks(daemon)
    _, _, body = fetch(daemon, "/status.json")
    status = json.loads(body)
    lock = status["tables"]["lockd"]["locks"][0]
    _, _, body = fetch(daemon, "/locks?table=lockd")
    listed = json.loads(body)["locks"][0]
    assert lock["name"] == listed["name"] == "nightly-backup"
    assert lock["holder"] == listed["holder"]
    assert [w["address"] for w in lock["waiters"]] == ["%s:%d" % s.getsockname() for s in socks[2:]]
    for s in socks:
        s.close()


OPERATIONS_GUIDE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "operations.md")


def shape(value):
    """The structure of a JSON value: its keys (recursively) and the types of its leaves."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def test_the_locks_example_in_the_operations_guide_has_the_shape_the_daemon_answers(daemon):
    """docs/operations.md shows a /locks answer for a held old-protocol lock with one waiter:
    the daemon's own answer for that situation must have exactly its keys and value types (a
    held lock's fencing token is a number, its expiry null; a node is null on a single node)."""
    text = open(OPERATIONS_GUIDE).read()
    example = json.loads(re.search(r"^```json\n(.*?)^```", text, re.S | re.M).group(1))
    holder, waiter = connect(daemon.addresses["lockd"]), connect(daemon.addresses["lockd"])
    assert lockd(holder, ACQ, b"nightly-backup") == ACQUIRED
    assert lockd(waiter, ACQ, b"nightly-backup") == ACK
    _, _, body = fetch(daemon, "/locks?table=lockd")
    live = json.loads(body)
    assert shape(live) == shape(example)
    assert live["locks"][0]["holder"]["session"].isdigit()
    assert live["locks"][0]["name"] == example["locks"][0]["name"]
    holder.close()
    waiter.close()
