"""The admin port read by real consumers: Prometheus's own text parser reads /metrics, and a
headless Chromium renders the status page against a daemon holding locks with waiters, on a
single node and on a three-node cluster (a follower and the leader).

The browser is the Debian `chromium` package, driven through Debian's `chromedriver` over the
W3C WebDriver protocol (plain HTTP and JSON; `make deps-browser` installs both). The layout is
checked from the DOM, not from pixels: the cluster card shows what /cluster says, and no card is
wider than its box (a table wider than its card scrolls inside it). The screenshots are kept under
target/screenshots/ (the test prints their paths) for a human to look at.
"""

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import CLIENT_TIMEOUT_S, start_holdfast, stop_holdfast

ALL_ON = ["--memcache", "127.0.0.1:0", "--lockd", "127.0.0.1:0", "--dlock", "off", "--counter", "off",
          "--admin", "127.0.0.1:0", "--threads", "2"]
# How long Chromium may take to start, load the page and run its first refresh.
BROWSER_TIMEOUT_S = 60
SCREENSHOTS = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "target", "screenshots"))


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


# The browser's flags: headless, no sandbox (root in CI), and nothing that reaches the network.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-quic", "--disable-dev-shm-usage", "--hide-scrollbars"]


def chromium(args, profile):
    base = [find_chromium()] + CHROMIUM_FLAGS + [f"--user-data-dir={profile}", "--virtual-time-budget=5000"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """Headless Chromium driven by chromedriver over the W3C WebDriver protocol (JSON over HTTP on
    127.0.0.1), with a fresh profile. Stopped by the PID of the chromedriver it started (which
    ends its own Chromium when the session is deleted)."""

    def __init__(self, profile):
        driver = shutil.which("chromedriver")
        if driver is None:
            pytest.fail("no chromedriver: `make deps-browser` installs the Debian package")
        self.port = free_port()
        self.proc = subprocess.Popen([driver, f"--port={self.port}"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.session = None
        deadline = time.monotonic() + BROWSER_TIMEOUT_S
        while True:
            try:
                if self._call("GET", "/status")["value"]["ready"]:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                pytest.fail("chromedriver did not start")
            time.sleep(0.1)
        options = {"binary": find_chromium(), "args": CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]}
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}}
        self.session = self._call("POST", "/session", caps)["value"]["sessionId"]

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=BROWSER_TIMEOUT_S) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"webdriver {method} {path}: {e.code} {e.read()[:2000]!r}") from None

    def cmd(self, method, path, body=None):
        return self._call(method, f"/session/{self.session}{path}", body)["value"]

    def size(self, width, height):
        """Make the viewport (not the window) width x height CSS pixels."""
        self.cmd("POST", "/goog/cdp/execute", {"cmd": "Emulation.setDeviceMetricsOverride", "params": {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}})
        got = self.js("return [window.innerWidth, window.innerHeight];")
        assert got == [width, height], f"viewport {got}, wanted {width}x{height}"

    def open(self, address):
        self.cmd("POST", "/url", {"url": address})

    def js(self, script, *args):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, script, what, timeout=BROWSER_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(script)
            if value:
                return value
            if time.monotonic() > deadline:
                body = self.js("return document.body.innerText;")
                pytest.fail(f"the page never showed {what}:\n{body[-3000:]}")
            time.sleep(0.2)

    def screenshot(self, path, full_page=False):
        if full_page:
            shot = self.cmd("POST", "/goog/cdp/execute", {"cmd": "Page.captureScreenshot", "params": {
                "format": "png", "captureBeyondViewport": True}})["data"]
        else:
            shot = self.cmd("GET", "/screenshot")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot))
        assert os.path.getsize(path) > 5000
        return path

    def close(self):
        try:
            if self.session is not None:
                self._call("DELETE", f"/session/{self.session}")
        finally:
            self.session = None
            if self.proc.poll() is None:
                self.proc.terminate()  # SIGTERM to the chromedriver this test started, by PID
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()


@pytest.fixture
def browser():
    with tempfile.TemporaryDirectory() as profile:
        b = Browser(profile)
        try:
            yield b
        finally:
            b.close()


# Every card, every table: its width against its card's. A card whose content is wider than its
# box overflows (scrollWidth > clientWidth); a table wider than its wrapper is fine only if the
# wrapper scrolls (overflow-x auto or scroll) and the wrapper itself stays inside the card.
LAYOUT = """
const out = {viewport: window.innerWidth, page: document.documentElement.scrollWidth, cards: [], tables: [],
             facts: [...document.querySelectorAll(".fact:not(.health) .v")].filter(v => v.offsetParent).map(v => ({
               id: v.id, text: v.textContent,
               lines: Math.round(v.getBoundingClientRect().height / parseFloat(getComputedStyle(v).lineHeight))}))};
for (const s of document.querySelectorAll("main > section")) {
  if (s.hidden) continue;
  const r = s.getBoundingClientRect();
  out.cards.push({card: s.querySelector("h2").textContent, scroll: s.scrollWidth, client: s.clientWidth,
                  left: r.left, right: r.right});
  for (const t of s.querySelectorAll("table")) {
    const w = t.parentElement, wr = w.getBoundingClientRect();
    out.tables.push({card: s.querySelector("h2").textContent, table: t.id, width: t.scrollWidth,
                     wrapper: w.clientWidth, overflow: getComputedStyle(w).overflowX,
                     inside: wr.left >= r.left - 0.5 && wr.right <= r.right + 0.5});
  }
}
return out;
"""


def check_layout(b, width):
    """No card overflows and the page does not scroll sideways; a table wider than its card
    scrolls inside its card; the cluster card's facts (but the health reason) fit on one line.
    At desktop width (1280) every table fits without scrolling."""
    layout = b.js(LAYOUT)
    assert layout["viewport"] == width
    assert layout["page"] <= width, f"the page scrolls sideways at {width} px: {layout}"
    for c in layout["cards"]:
        assert c["scroll"] <= c["client"], f"card {c['card']!r} overflows at {width} px: {c}"
        assert c["left"] >= 0 and c["right"] <= width, f"card {c['card']!r} leaves the page: {c}"
    for f in layout["facts"]:
        assert f["lines"] == 1, f"cluster fact {f['id']} ({f['text']!r}) wraps at {width} px: {f}"
    for t in layout["tables"]:
        assert t["inside"], f"table {t['table']} leaves its card at {width} px: {t}"
        if width >= 1280:
            assert t["width"] <= t["wrapper"], f"table {t['table']} is clipped at {width} px: {t}"
        elif t["width"] > t["wrapper"]:
            assert t["overflow"] in ("auto", "scroll"), f"table {t['table']} overflows at {width} px: {t}"
    return layout


def say(capsys, line):
    with capsys.disabled():
        print(f"\n{line}", end="")


SIZES = [(1280, 900), (390, 844)]
PAGE_READY = "return document.getElementById('state').textContent.startsWith('live, ');"


def shoot(b, capsys, name):
    """At each size: check the layout, save a screenshot (and a whole-page one on the phone)."""
    for width, height in SIZES:
        b.size(width, height)
        b.wait_for(PAGE_READY, "a live refresh")
        check_layout(b, width)
        path = b.screenshot(os.path.join(SCREENSHOTS, f"{name}-{width}x{height}.png"))
        say(capsys, f"screenshot: {path}")
        if width < 1280:
            path = b.screenshot(os.path.join(SCREENSHOTS, f"{name}-{width}-full.png"), full_page=True)
            say(capsys, f"screenshot: {path}")


def counter_acquire(s, name, resources, maximum):
    """yrmcds counter Acquire; returns the status byte."""
    body = struct.pack(">IIH", resources, maximum, len(name)) + name
    s.sendall(struct.pack(">BBBBII", 0x90, 0x02, 0, 0, len(body), 7) + body)
    head = recv_exactly(s, 12)
    recv_exactly(s, struct.unpack(">I", head[4:8])[0])
    return head[2]


def varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def pb_varints(buf):
    """The varint fields of a protobuf message, {field number: value} (others skipped)."""
    out, i = {}, 0

    def read():
        nonlocal i
        n = shift = 0
        while True:
            b = buf[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n
    while i < len(buf):
        key = read()
        field, kind = key >> 3, key & 7
        if kind == 0:
            out[field] = read()
        elif kind == 2:
            n = read()  # read() moves i: `i += read()` would add to the old i
            i += n
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        else:
            raise AssertionError(f"wire type {kind} in {buf!r}")
    return out


def dlock_lease(s, key, lease_s):
    """A dlock Lock of `key` as a lease (the request encoded by hand: id 1, type Lock,
    lock { release_micro, keys }); returns the response frame."""
    lock = b"\x10" + varint(lease_s * 1_000_000) + b"\x1a" + varint(len(key)) + key
    req = b"\x10\x01\x20\x02" + b"\x9a\x03" + varint(len(lock)) + lock
    s.sendall(struct.pack(">I", len(req)) + req)
    n = struct.unpack(">I", recv_exactly(s, 4))[0]
    return recv_exactly(s, n)


def hold_all_kinds(memcache, lockd_addrs, dlock_addr, counter_addr):
    """A memcache lock, a lockd lock with two waiters (through `lockd_addrs`, round-robin), a
    dlock lease and counter slots: a row of every table with every column filled."""
    mc = connect(memcache)
    mc.sendall(b"set report 0 0 1\r\nv\r\nlock report\r\n")
    assert recv_exactly(mc, 12) == b"STORED\r\nOK\r\n"
    holder, w1, w2 = (connect(lockd_addrs[i % len(lockd_addrs)]) for i in range(3))
    assert lockd(holder, ACQ, b"nightly-backup") == ACQUIRED
    assert lockd(w1, ACQ, b"nightly-backup") == ACK
    assert lockd(w2, ACQ, b"nightly-backup") == ACK
    dl = connect(dlock_addr)
    reply = dlock_lease(dl, b"leader-election", 300)
    assert pb_varints(reply).get(3, 0) == 0, reply  # status Ok
    ct = connect(counter_addr)
    assert counter_acquire(ct, b"encoders", 3, 4) == 0
    return [mc, holder, w1, w2, dl, ct]


@pytest.fixture
def full_daemon():
    flags = ["--memcache", "127.0.0.1:0", "--lockd", "127.0.0.1:0", "--dlock", "127.0.0.1:0",
             "--counter", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--threads", "2"]
    d = start_holdfast(base=flags, want=("memcache", "lockd", "dlock", "counter", "admin"))
    yield d
    stop_holdfast(d.proc)
    assert d.proc.returncode == 0


def test_status_page_in_a_headless_browser_shows_holders_and_waiters(full_daemon, browser, capsys):
    d = full_daemon
    socks = hold_all_kinds(d.addresses["memcache"], [d.addresses["lockd"]], d.addresses["dlock"],
                           d.addresses["counter"])
    holder_addr = "%s:%d" % socks[1].getsockname()
    waiter_addrs = ["%s:%d" % s.getsockname() for s in socks[2:4]]
    browser.open(url(d, "/"))
    browser.wait_for(PAGE_READY, "a live refresh")
    text = browser.wait_for("return document.querySelectorAll('#locks tbody tr').length === 4 && "
                            "document.body.innerText;", "four held locks")
    assert "nightly-backup" in text and "report" in text and "encoders" in text
    assert holder_addr in text
    # Both waiters, in their order.
    assert text.index(waiter_addrs[0]) < text.index(waiter_addrs[1])
    assert "2: " in text
    # A single node has no cluster card.
    assert browser.js("return document.getElementById('cluster-card').hidden;") is True
    rows = browser.js("""return Object.fromEntries([...document.querySelectorAll('#locks tbody tr')]
        .map(tr => [tr.cells[1].textContent, [...tr.cells].map(c => c.textContent)]));""")
    head = browser.js("return [...document.querySelectorAll('#locks thead th')].map(c => c.textContent);")
    assert head == ["table", "name", "holder", "held for", "fence", "expires in", "slots", "waiters", "value"]
    # The lease: 300 s left, in minutes; the counter holder: 3 slots and its token; every grant
    # has its fencing token.
    assert re.fullmatch(r"[45](\.\d)? min", rows["leader-election"][5]), rows
    assert rows["encoders"][6] == "3" and rows["encoders"][4].isdigit(), rows
    assert all(r[4].isdigit() for r in rows.values()), rows
    assert re.fullmatch(r"\d+ ms|\d+(\.\d)? s", rows["report"][3]), rows
    shoot(browser, capsys, "single")
    for s in socks:
        s.close()


def pb_field(field, value):
    """One protobuf field: a varint for an int, length-delimited for bytes."""
    if isinstance(value, bytes):
        return varint(field << 3 | 2) + varint(len(value)) + value
    return varint(field << 3) + varint(value)


def native(s, rid, rtype, key, **fields):
    """One version-3 (native protocol) request of `key` (RequestLock fields by number: shared
    100, limit 101, value 102, release_micro 2); returns the answer's status."""
    numbers = {"release_micro": 2, "shared": 100, "limit": 101, "value": 102}
    lock = pb_field(3, key) + b"".join(pb_field(numbers[k], v) for k, v in fields.items())
    req = pb_field(1, 3) + pb_field(2, rid) + pb_field(4, rtype) + pb_field(51, lock)
    s.sendall(struct.pack(">I", len(req)) + req)
    n = struct.unpack(">I", recv_exactly(s, 4))[0]
    return pb_varints(recv_exactly(s, n)).get(3, 0)


NATIVE_LOCK, NATIVE_WATCH = 2, 5


def test_status_page_shows_shared_holders_semaphore_slots_values_and_watchers(full_daemon, browser, capsys):
    d = full_daemon
    dlock_addr = d.addresses["dlock"]
    socks = [connect(dlock_addr) for _ in range(5)]
    r1, r2, p1, p2, w = socks
    assert native(w, 1, NATIVE_WATCH, b"cache") == 0
    assert native(r1, 1, NATIVE_LOCK, b"cache", shared=1, value=b"reader-1") == 0
    assert native(r2, 1, NATIVE_LOCK, b"cache", shared=1, value=b"\x00\x01\xff") == 0
    assert native(p1, 1, NATIVE_LOCK, b"pool", limit=3, value=b"worker-1") == 0
    assert native(p2, 1, NATIVE_LOCK, b"pool", limit=3, release_micro=300_000_000) == 0
    browser.open(url(d, "/"))
    browser.wait_for(PAGE_READY, "a live refresh")
    browser.wait_for("return document.querySelectorAll('#locks tbody tr').length === 4;",
                     "a row per holder")
    rows = browser.js("""return [...document.querySelectorAll('#locks tbody tr')]
        .map(tr => [...tr.cells].map(c => c.textContent));""")
    head = browser.js("return [...document.querySelectorAll('#locks thead th')].map(c => c.textContent);")
    col = {name: i for i, name in enumerate(head)}
    cache = [r for r in rows if r[col["name"]].startswith("cache")]
    pool = [r for r in rows if r[col["name"]].startswith("pool")]
    assert len(cache) == 2 and len(pool) == 2, rows
    # The key's first row: its tags; each holder's row: its fence and value.
    assert "shared ×2" in cache[0][col["name"]] and "1 watcher" in cache[0][col["name"]], rows
    assert [r[col["value"]] for r in cache] == ["reader-1", "0x0001ff"], rows
    assert int(cache[0][col["fence"]]) < int(cache[1][col["fence"]]), rows
    assert "%s:%d" % r2.getsockname() in cache[1][col["holder"]], rows
    assert "semaphore" in pool[0][col["name"]], rows
    assert pool[0][col["slots"]] == "2 of 3", rows
    assert [r[col["value"]] for r in pool] == ["worker-1", ""], rows
    # The summary counts the held keys of either version.
    held = browser.js("""return [...document.querySelectorAll('#summary tbody tr')]
        .map(tr => [tr.cells[0].textContent, tr.cells[1].textContent]);""")
    assert ["dlock", "2"] in held, held
    assert re.fullmatch(r"[45](\.\d)? min", pool[1][col["expires in"]]), rows
    shoot(browser, capsys, "native")
    for s in socks:
        s.close()


def test_status_page_works_with_an_admin_token_over_basic_auth(tmp_path, capsys):
    """With --admin-token-file the page needs the token; a browser sends it as Basic auth (here
    in the URL), and the page's own fetches of /status.json carry it too."""
    token = tmp_path / "admin-token"
    token.write_text("s3cret-token\n")
    token.chmod(0o600)
    d = start_holdfast("--admin-token-file", str(token), base=ALL_ON, want=("memcache", "lockd", "admin"))
    try:
        host, port = d.addresses["admin"]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url(d, "/status.json"), timeout=CLIENT_TIMEOUT_S)
        assert refused.value.code == 401
        with tempfile.TemporaryDirectory() as profile:
            run = chromium(["--dump-dom", f"http://admin:s3cret-token@{host}:{port}/"], profile)
        assert "live, " in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    finally:
        stop_holdfast(d.proc)


CLUSTER_LISTENERS = ("memcache", "lockd", "dlock", "counter", "admin")


def http_json(address, path):
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}{path}", timeout=CLIENT_TIMEOUT_S) as r:
        return r.status, json.loads(r.read())


def healthz(address):
    try:
        with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/healthz", timeout=CLIENT_TIMEOUT_S) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


@pytest.fixture
def cluster(tmp_path):
    """Three nodes on 127.0.0.1 (client listeners on port 0, peer ports picked free, the default
    election timeout: a busy machine gets no spurious no-quorum answers), data in tmp_path;
    ready once every node is healthy, knows the same leader and reaches every peer. Stopped by
    PID."""
    peers = ",".join(f"{i}=127.0.0.1:{free_port()}" for i in (1, 2, 3))
    nodes = []
    try:
        for i in (1, 2, 3):
            flags = ["--peers", peers, "--node-id", str(i), "--data-dir", str(tmp_path / f"node{i}"),
                     "--threads", "1"]
            for name in CLUSTER_LISTENERS:
                flags += [f"--{name}", "127.0.0.1:0"]
            nodes.append(start_holdfast(base=flags, want=CLUSTER_LISTENERS))
        deadline = time.monotonic() + 30
        while True:
            views = []
            if all(healthz(n.addresses["admin"]) == 200 for n in nodes):
                views = [http_json(n.addresses["admin"], "/cluster")[1] for n in nodes]
            if views and len({v["leader"] for v in views}) == 1 and views[0]["leader"] != 0 and all(
                    p["reachable"] for v in views for p in v["peers"]):
                break
            assert time.monotonic() < deadline, f"the cluster never formed: {views}"
            time.sleep(0.1)
        yield nodes
    finally:
        for n in nodes:
            stop_holdfast(n.proc)


def test_status_page_of_a_cluster_on_a_follower_and_on_the_leader(cluster, browser, capsys):
    views = {i + 1: http_json(n.addresses["admin"], "/cluster")[1] for i, n in enumerate(cluster)}
    leader = views[1]["leader"]
    follower = next(i for i in views if i != leader)
    other = next(i for i in views if i not in (leader, follower))
    f, o = cluster[follower - 1], cluster[other - 1]
    # Locks taken through the follower, one waiter through the third node.
    socks = hold_all_kinds(f.addresses["memcache"], [f.addresses["lockd"], o.addresses["lockd"]],
                           f.addresses["dlock"], f.addresses["counter"])
    for node, name in ((follower, "follower"), (leader, "leader")):
        n = cluster[node - 1]
        browser.size(1280, 900)
        browser.open(url(n, "/"))
        browser.wait_for(PAGE_READY, "a live refresh")
        browser.wait_for("return document.querySelectorAll('#locks tbody tr').length === 4;", "four held locks")
        card = browser.wait_for("""const c = document.getElementById('cluster-card');
            return !c.hidden && document.querySelectorAll('#peers tbody tr').length === 3 && {
              role: document.getElementById('c-role').textContent,
              leader: document.getElementById('c-leader').textContent,
              term: document.getElementById('c-term').textContent,
              applied: document.getElementById('c-applied').textContent,
              fenced: document.getElementById('c-fenced').textContent,
              health: document.getElementById('c-health').textContent,
              banner: document.getElementById('banner').hidden,
              peers: [...document.querySelectorAll('#peers tbody tr')].map(tr => [...tr.cells].map(c => c.textContent)),
            };""", "the cluster card")
        view = http_json(n.addresses["admin"], "/cluster")[1]
        assert card["role"] == view["role"] == name, card
        assert card["leader"] == str(view["leader"]) == str(leader), card
        assert card["term"] == str(view["term"]), (card, view)
        assert int(card["applied"]) > 0
        assert card["fenced"] == "no" and card["health"] == "ok" and card["banner"] is True, card
        for row in card["peers"]:
            if row[0].startswith(str(node)):
                assert "this node" in row[0], card
            else:
                assert row[1] == "yes" and row[2].endswith(" ago"), card
        leader_rows = [r for r in card["peers"] if r[0].startswith(str(leader))]
        assert "leader" in leader_rows[0][0], card
        # The waiter that came through the third node is shown with it.
        text = browser.js("return document.body.innerText;")
        assert f"on node {other}" in text and f"on node {follower}" in text
        shoot(browser, capsys, f"cluster-{name}")
    for s in socks:
        s.close()
    # The follower alone: it fences itself, and the page says so above everything else.
    for node in (leader, other):
        stop_holdfast(cluster[node - 1].proc)
    deadline = time.monotonic() + 30
    while not http_json(f.addresses["admin"], "/cluster")[1]["fenced"]:
        assert time.monotonic() < deadline, "the lone follower never fenced itself"
        time.sleep(0.1)
    browser.size(1280, 900)
    browser.open(url(f, "/"))
    browser.wait_for(PAGE_READY, "a live refresh")
    fenced = browser.wait_for("""return !document.getElementById('banner').hidden && {
        banner: document.getElementById('banner').textContent,
        fenced: document.getElementById('c-fenced').textContent,
        tile: document.getElementById('f-fenced').className,
        health: document.getElementById('c-health').textContent,
        top: document.getElementById('banner').getBoundingClientRect().top,
      };""", "the fenced banner")
    assert fenced["fenced"] == "FENCED" and "bad" in fenced["tile"], fenced
    assert fenced["banner"].startswith("Fenced") and fenced["health"] != "ok", fenced
    assert fenced["top"] < 100, "the banner is at the top of the page"
    shoot(browser, capsys, "cluster-fenced")


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


def test_the_dlock_example_in_the_operations_guide_has_the_shape_the_daemon_answers(full_daemon):
    """docs/operations.md shows a dlock entry of /locks: a semaphore of 3 slots with two
    holders (a connection-bound one with a text value, a lease with bytes) and one watcher. The
    daemon's own entry for that situation must have exactly its keys and value types."""
    text = open(OPERATIONS_GUIDE).read()
    blocks = re.findall(r"^```json\n(.*?)^```", text, re.S | re.M)
    example = next(json.loads(b) for b in blocks if '"holders"' in b)
    d = full_daemon
    p1, p2, w = (connect(d.addresses["dlock"]) for _ in range(3))
    assert native(w, 1, NATIVE_WATCH, b"pool") == 0
    assert native(p1, 1, NATIVE_LOCK, b"pool", limit=3, value=b"worker-1") == 0
    assert native(p2, 1, NATIVE_LOCK, b"pool", limit=3, value=b"\x00\x01\xff",
                  release_micro=60_000_000) == 0
    _, _, body = fetch(d, "/locks?table=dlock")
    live = json.loads(body)["locks"][0]
    assert shape(live) == shape(example)
    assert shape(live["holders"][1]) == shape(example["holders"][1])
    for k in ("name", "mode", "limit", "holders_total", "lock_delay_ms", "watchers"):
        assert live[k] == example[k], k
    assert [h["value"] for h in live["holders"]] == ["worker-1", None]
    assert live["holders"][1]["value_hex"] == "0001ff"
    for s in (p1, p2, w):
        s.close()
