"""The "state" part of `make bench-cluster` (BENCH_PARTS=state, or `make bench-cluster-state`):
a cluster serving a large state (the state-size goal: 1 GiB of items or 5 million held
locks) with no leader change, no no-quorum answer and no stall caused by its own housekeeping.

Sub-parts (STATE_PARTS, default items,locks,paused,wiped):

- items: a fresh 3-node cluster (--memory sized for the state). One writer streams pipelined
  `set k<i> 0 0 1000 noreply` through node 1 until STATE_BYTES of values are written, while a
  probe process times one old-protocol TRY + REL on node 2 every 10 ms. Reported: write MB/s,
  probe p50/p99/max, the disk floor beside them (a 4 KiB append + fdatasync every 10 ms in the
  data directories' filesystem), leader changes (every node's /cluster polled every 150 ms, and the
  leader-change counters), no-quorum answers (probe errors, and the nodes' counters), fences,
  peak RSS per node (its VmRSS every 100 ms, plus the own pages of its forked snapshot child,
  read every second: a child has the node as parent; VmHWM at the end), state size (the item
  bytes of /metrics), data directory size at the end and its peak (sampled every second).
  Beside it the same write through one holdfast node and through a 3-node etcd cluster (JSON
  gateway `/v3/kv/put`, pipelined, through its node 1), with etcd's own probe (a put + a
  delete of one key on its node 2: two commits in a row, as TRY + REL) and the disk floor
  beside it.
- locks: the same with STATE_LOCKS held old-protocol locks (pipelined TRY of distinct names, 200
  at a time per connection, on a few connections to node 1, kept open), beside one holdfast node
  holding the same locks.
- paused: on the cluster of `items`, after the fill: SIGSTOP a follower, keep writing (the same
  keys again: the state keeps its size) until the leader has made two snapshots (its
  `holdfast_cluster_snapshots_total{result="made"}`, if the node has it, else new `snap-*` files in its
  data directory), SIGCONT it; the time until its applied index reaches the leader's commit
  index, and the peak RSS of both meanwhile.
- wiped: on the same cluster: `holdfast cluster remove` a follower, stop it, wipe its data
  directory, start it with --join under a new id, `holdfast cluster add` it; the time until its
  applied index reaches the leader's commit index and a lock on it is granted.

Environment: STATE_BYTES (1G; K, M, G suffixes are binary), STATE_LOCKS (5000000),
STATE_PARTS, STATE_ETCD (1; 0 skips the etcd fill), STATE_SINGLE (1; 0 skips the one-node fills),
STATE_DEADLINE (1800: seconds any one fill may take), plus bench_cluster's BENCH_DATA_DIR and
BENCH_KEEP. A quick run: STATE_BYTES=100M STATE_LOCKS=500000. STATE_PROBE_TRACE=FILE appends
one line per probe to FILE: its start (Unix seconds) and its latency (ms), to set beside the
nodes' logged snapshots. STATE_METRICS_DIR=DIR writes each node's /metrics at the end of the
items fill to DIR/items-node<i>.txt (its log-sync and proposal-to-apply histograms).
"""

import base64
import collections
import multiprocessing
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import bench
from bench import Failure, free_port, log, wait_accepting
from bench_cluster import (ETCD, HOLDFAST, EtcdCluster, HoldfastCluster,
                           http_get, load_average, lock_round_trip, quantile, read_line)


def parse_size(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGkmg]?)i?[Bb]?\s*", text)
    if not m:
        raise Failure(f"bad size {text!r} (e.g. 1G, 300M)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


STATE_BYTES = parse_size(os.environ.get("STATE_BYTES", "1G"))
STATE_LOCKS = int(os.environ.get("STATE_LOCKS", "5000000"))
STATE_PARTS = os.environ.get("STATE_PARTS", "items,locks,paused,wiped").split(",")
WITH_ETCD = os.environ.get("STATE_ETCD", "1") != "0"
WITH_SINGLE = os.environ.get("STATE_SINGLE", "1") != "0"
FILL_DEADLINE = float(os.environ.get("STATE_DEADLINE", "1800"))
METRICS_DIR = os.environ.get("STATE_METRICS_DIR")
PROBE_TRACE = os.environ.get("STATE_PROBE_TRACE")
VALUE_SIZE = 1000
# The item store's limit: four times the values (keys and item overhead fit with room; no
# eviction), at least holdfast's default.
MEMORY_MIB = max(1024, 4 * STATE_BYTES >> 20)
# Commands written at once by the item writer; a `get` of the last key after every
# GET_EVERY bytes, at most GET_WINDOW of them unanswered (flow control and progress).
SET_BATCH = 200
GET_EVERY = 8 << 20
GET_WINDOW = 4
# Locks: TRYs written at once per connection, and connections.
LOCK_BATCH = 200
LOCK_CONNECTIONS = 4
# The probe: one TRY + REL every PROBE_EVERY seconds on node 2's old-protocol port.
PROBE_EVERY = 0.010
PROBE_TIMEOUT = 30.0
# Samplers: RSS every 100 ms, a snapshot child's own pages every 1 s, /cluster of each node
# every 150 ms, data directories every 1 s.
RSS_EVERY, CHILD_EVERY, STATUS_EVERY, DU_EVERY = 0.1, 1.0, 0.15, 1.0
# Paused follower: writes allowed before giving up on two snapshots (a multiple of the state),
# and how long its catch-up may take; the wiped node likewise.
PAUSED_WRITE_FACTOR = 6
CATCH_UP_DEADLINE = 600.0
# etcd: connections and requests in flight per connection (its HTTP/1.1 gateway answers a
# connection's requests one after another: many connections, as a gRPC client's streams).
ETCD_CONNECTIONS = 64
ETCD_WINDOW = 4
# Goals.
GOAL_P99_MS, GOAL_MAX_MS, GOAL_RSS_FACTOR, GOAL_CATCH_UP_S = 20, 200, 2.0, 30

# A finished snapshot file: snap-<index>-<term> (src/cluster/storage.rs, snapfile.rs).
SNAP_FILE = re.compile(r"snap-\d+-\d+")

# Old-protocol opcodes and replies (docs/protocol.md).
OP_REL, OP_TRY = 2, 3
R_ACQUIRED, R_WBLOCK, R_RELEASED, R_ERR = 128, 129, 130, 133


def frame(op, name):
    payload = name + b"\0"
    return struct.pack(">I", 1 << 28 | op << 20 | len(payload)) + payload


def mib(n):
    return "-" if n is None else f"{n / (1 << 20):,.0f}"


def verdict(ok):
    return "PASS" if ok else "FAIL"


# ---- process and /proc helpers ----

def proc_status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def children(pid):
    """PIDs of the live children of `pid` (every thread's /proc children list)."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(c) for c in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def private_kib(pid):
    """The memory of pid that no other process maps (/proc/PID/smaps_rollup, Private_Clean +
    Private_Dirty): for a forked snapshot child, the pages only it still maps (those its node
    has copied or freed since the fork) and its own allocations.

    Reading it walks pid's page tables (about 25 ms per GiB here) under pid's memory-map lock,
    so it is read only for children, and seldom: on a node itself it would stall every mmap,
    munmap and brk of the node for as long, which is the probe's latency tail."""
    total = None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total = (total or 0) + int(line.split()[1])
    except OSError:
        pass
    return total


def disk_bytes(path):
    """Bytes the files under `path` occupy on disk (du: allocated blocks)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def metrics(port, timeout=2.0):
    """The node's /metrics as {name{labels}: value} (None if it does not answer)."""
    try:
        code, body = http_get(port, "/metrics", timeout=timeout)
    except OSError:
        return None
    if code != 200:
        return None
    out = {}
    for line in body.decode(errors="replace").splitlines():
        if line and not line.startswith("#"):
            parts = line.rsplit(" ", 1)
            if len(parts) == 2:
                try:
                    out[parts[0]] = float(parts[1])
                except ValueError:
                    pass
    return out


def metric(m, name):
    return None if m is None or name not in m else int(m[name])


# ---- the cluster ----

class StateCluster(HoldfastCluster):
    """Three nodes with the old-protocol listener on, --memory sized for the state; nodes can
    be added (--join) under new ids."""

    def __init__(self, procs, datadir, tag):
        super().__init__(procs, datadir, tag)
        self.datadir = datadir
        self.lockd = {i: free_port() for i in self.ids}
        self.joining = set()

    def add_id(self, i):
        self.ids.append(i)
        self.peer[i], self.mc[i], self.admin[i], self.lockd[i] = (free_port() for _ in range(4))
        self.dirs[i] = os.path.join(self.datadir, f"{self.tag}-{i}")
        self.joining.add(i)

    def start(self, i):
        peers = ",".join(f"{j}=127.0.0.1:{self.peer[j]}" for j in self.ids)
        argv = [HOLDFAST, "--peers", peers, "--node-id", str(i), "--data-dir", self.dirs[i],
                "--memcache", f"127.0.0.1:{self.mc[i]}", "--lockd", f"127.0.0.1:{self.lockd[i]}",
                "--dlock", "off", "--counter", "off", "--admin", f"127.0.0.1:{self.admin[i]}",
                "--memory", str(MEMORY_MIB)]
        if i in self.joining:
            argv.append("--join")
        return self.procs.spawn(self.name(i), argv)

    def running(self):
        return [i for i in self.ids if self.name(i) in self.procs.procs]


def start_single(procs, name):
    mc, lockd = free_port(), free_port()
    proc = procs.spawn(name, [HOLDFAST, "--memcache", f"127.0.0.1:{mc}",
                              "--lockd", f"127.0.0.1:{lockd}", "--dlock", "off",
                              "--counter", "off", "--admin", "off", "--memory", str(MEMORY_MIB)])
    wait_accepting(mc, proc, name)
    wait_accepting(lockd, proc, name)
    return proc, mc, lockd


# ---- the probe (a process of its own: the writer's GIL must not delay it) ----

def paced_probe(stop, conn, connect, once, trace=None):
    """Every PROBE_EVERY s until `stop`: once(sock, buf) on the connection connect() made (a
    new one after an error). Sends back (latencies in s, errors as text) through `conn`; with
    `trace`, one line per probe (its start in Unix seconds, its latency in ms)."""
    # The parent's handlers (SIGTERM raising KeyboardInterrupt) are not this process's: it is
    # stopped by `stop`, or by SIGTERM to its PID; a Ctrl-C is the parent's to handle.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lat, errors = [], []
    sock, buf = None, bytearray()
    next_at = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if now < next_at:
            time.sleep(next_at - now)
        next_at = max(next_at + PROBE_EVERY, time.monotonic())
        try:
            if sock is None:
                sock = connect()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buf = bytearray()
            sent = time.monotonic()
            once(sock, buf)
            took = time.monotonic() - sent
            lat.append(took)
            if trace is not None:
                trace.write(f"{time.time() - took:.3f} {took * 1000:.1f}\n")
        except OSError as e:
            errors.append(f"{time.monotonic():.3f} {e}")
            if sock is not None:
                sock.close()
                sock = None
            stop.wait(0.05)
    if sock is not None:
        sock.close()
    conn.send((lat, errors))
    conn.close()


def probe_main(port, stop, conn):
    """TRY + REL of one name (a new one on each connection) every PROBE_EVERY s."""
    name = [b""]

    def connect():
        name[0] = f"state-probe-{os.getpid()}-{time.monotonic_ns()}".encode()
        return socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT)

    def once(sock, buf):
        sock.sendall(frame(OP_TRY, name[0]))
        op = read_frame(sock, buf)
        if op != R_ACQUIRED:
            raise OSError(f"TRY answered {op}")
        sock.sendall(frame(OP_REL, name[0]))
        op = read_frame(sock, buf)
        if op != R_RELEASED:
            raise OSError(f"REL answered {op}")

    trace = open(PROBE_TRACE, "a") if PROBE_TRACE else None
    paced_probe(stop, conn, connect, once, trace)


def read_frame(sock, buf):
    """One old-protocol reply's opcode (the payload is dropped)."""
    while True:
        if len(buf) >= 4:
            h, = struct.unpack(">I", bytes(buf[:4]))
            end = 4 + (h & 0xFFFFF)
            if len(buf) >= end:
                del buf[:end]
                return h >> 20 & 0xFF
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("connection closed")
        buf += chunk


def etcd_probe_main(port, stop, conn):
    """etcd's counterpart of probe_main: a put and a delete of one key (two commits in a row,
    as TRY + REL are) through the JSON gateway every PROBE_EVERY s."""
    key = base64.b64encode(b"state-probe").decode()
    bodies = [('{"key":"%s","value":"%s"}' % (key, base64.b64encode(b"1").decode())).encode(),
              ('{"key":"%s"}' % key).encode()]
    reqs = [b"POST %s HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (path, len(body), body)
            for path, body in zip((b"/v3/kv/put", b"/v3/kv/deleterange"), bodies)]

    def once(sock, buf):
        for req in reqs:
            sock.sendall(req)
            http_response(sock, buf)

    paced_probe(stop, conn,
                lambda: socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT),
                once)


class Probe:
    """A probe in a process of its own: main(target, stop, conn) sends (latencies, errors)."""

    def __init__(self, target, main=probe_main):
        ctx = multiprocessing.get_context("fork")
        self.stop = ctx.Event()
        self.recv, send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=main, args=(target, self.stop, send), daemon=True)
        self.proc.start()
        send.close()

    def finish(self):
        """Stop it and return (sorted latencies, errors)."""
        self.stop.set()
        result = ([], ["the probe sent no result"])
        if self.recv.poll(PROBE_TIMEOUT + 10):
            result = self.recv.recv()
        self.kill()
        return sorted(result[0]), result[1]

    def kill(self):
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()  # by its PID
        self.proc.join(timeout=5)


# ---- samplers ----

class Monitor:
    """Samples, while a sub-part runs: each node's RSS (+ children), /cluster, data directory
    size; and its counters at the start and the end."""

    def __init__(self, cluster, nodes=None):
        self.c = cluster
        self.nodes = list(nodes or cluster.running())
        self.stop = threading.Event()
        self.peak_rss = {i: 0 for i in self.nodes}
        self.peak_children = {i: 0 for i in self.nodes}
        self.max_children = {i: 0 for i in self.nodes}
        self.peak_du = {i: 0 for i in self.nodes}
        self.leaders = set()  # (term, leader) seen, leader != 0
        self.fenced_seen = {i: 0 for i in self.nodes}
        self.unanswered = {i: 0 for i in self.nodes}
        self.last = {}
        self.start_metrics = {i: metrics(cluster.admin[i]) for i in self.nodes}
        self.child_own = {}  # a snapshot child's pid -> its own pages (KiB), last read
        self.threads = [threading.Thread(target=self.rss_loop, daemon=True),
                        threading.Thread(target=self.child_loop, daemon=True),
                        threading.Thread(target=self.du_loop, daemon=True)]
        self.threads += [threading.Thread(target=self.status_loop, args=(i,), daemon=True)
                         for i in self.nodes]
        self.load_before = os.getloadavg()
        for t in self.threads:
            t.start()

    def pids(self):
        out = {}
        for i in self.nodes:
            p = self.c.procs.procs.get(self.c.name(i))
            if p is not None and p.poll() is None:
                out[i] = p.pid
        return out

    def rss_loop(self):
        """A node's memory: its VmRSS (read without taking its memory-map lock) plus, while it
        has forked snapshot children, their own pages as `child_loop` last read them: the pages
        a node and its child share copy-on-write count once."""
        while not self.stop.wait(RSS_EVERY):
            for i, pid in self.pids().items():
                own = proc_status_kib(pid, "VmRSS")
                if own is None:
                    continue
                kids = children(pid)
                copies = sum(self.child_own.get(c, 0) for c in kids)
                self.peak_rss[i] = max(self.peak_rss[i], own + copies)
                self.peak_children[i] = max(self.peak_children[i], copies)
                self.max_children[i] = max(self.max_children[i], len(kids))

    def child_loop(self):
        """Each snapshot child's own pages, every CHILD_EVERY, at the lowest CPU priority (the
        walk of a child's page tables takes CPU the nodes need)."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass
        while not self.stop.wait(CHILD_EVERY):
            for pid in self.pids().values():
                for c in children(pid):
                    own = private_kib(c)
                    if own is not None:
                        self.child_own[c] = own

    def du_loop(self):
        while True:
            for i in self.nodes:
                self.peak_du[i] = max(self.peak_du[i], disk_bytes(self.c.dirs[i]))
            if self.stop.wait(DU_EVERY):
                return

    def status_loop(self, i):
        while not self.stop.wait(STATUS_EVERY):
            st = self.c.status(i)
            if st is None:
                self.unanswered[i] += 1
                continue
            self.last[i] = st
            if st.get("leader"):
                self.leaders.add((st.get("term"), st.get("leader")))
            if st.get("fenced"):
                self.fenced_seen[i] += 1

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        self.load_after = os.getloadavg()
        self.end_metrics = {i: metrics(self.c.admin[i]) for i in self.nodes}
        self.hwm = {i: proc_status_kib(pid, "VmHWM") for i, pid in self.pids().items()}
        self.du_end = {i: disk_bytes(self.c.dirs[i]) for i in self.nodes}
        for i in self.nodes:
            self.peak_du[i] = max(self.peak_du[i], self.du_end[i])
        return self

    def delta(self, i, name):
        a = metric(self.start_metrics.get(i), name)
        b = metric(self.end_metrics.get(i), name)
        return None if a is None or b is None else b - a

    def leader_changes(self):
        """(distinct (term, leader) seen - 1, largest per-node leader-change counter delta)."""
        seen = max(0, len(self.leaders) - 1)
        deltas = [self.delta(i, "holdfast_cluster_leader_changes_total") for i in self.nodes]
        return seen, max((d for d in deltas if d is not None), default=None)

    def no_quorum(self):
        return sum(self.delta(i, "holdfast_cluster_no_quorum_answers_total") or 0
                   for i in self.nodes)

    def fences(self):
        return sum(self.delta(i, "holdfast_cluster_fences_total") or 0 for i in self.nodes)


# ---- writers ----

class ItemWriter:
    """Pipelined `set k<i> 0 0 1000 noreply` over one connection; a `get` of the last key
    every GET_EVERY bytes (at most GET_WINDOW unanswered) paces it and shows progress."""

    def __init__(self, port, deadline):
        self.port, self.deadline = port, deadline
        self.value = b"v" * VALUE_SIZE
        self.resume = 0
        self.reconnects = 0  # bounded by the deadline only: today's code fences under a fill
        self.errors = []

    def connect(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        s.settimeout(60)
        return s

    def write(self, first, count, keys=None):
        """Set keys first..first+count (modulo `keys` if given). Returns the seconds from the
        first byte to the answer of a `get` of the last key written (which follows every
        set on that connection)."""
        start = time.monotonic()
        i, last = first, first
        while i < first + count:
            if time.monotonic() > self.deadline:
                raise Failure(f"item writer: not done within {FILL_DEADLINE:.0f} s")
            try:
                i = self.stream(i, first + count, keys)
            except OSError as e:
                i = self.resume  # the first set not confirmed by an answered get
                self.reconnects += 1
                self.errors.append(str(e))
                time.sleep(0.2)
            last = i - 1
        key = last if keys is None else last % keys
        # The last set is answered (a hit) through the same kind of connection.
        while True:
            try:
                with self.connect() as s:
                    buf = bytearray()
                    s.sendall(f"get k{key}\r\n".encode())
                    if read_line(s, buf).startswith(b"VALUE"):
                        break
            except OSError:
                pass
            if time.monotonic() > self.deadline:
                raise Failure(f"item writer: k{key} not readable")
            time.sleep(0.1)
        return time.monotonic() - start

    def stream(self, i, end, keys):
        """Write from key i until end on one connection and return end once a `get` of the
        last key has hit. Every answered progress `get` (a hit) confirms the sets before it on
        the connection: `self.resume` is then the first unconfirmed key, where the next
        connection starts should this one break (sets sent but unconfirmed may be lost with
        it). The connection is closed only with every `get` answered: closing with unread
        replies resets it, and the node may drop the sets it has not read yet."""
        self.resume = i
        s = self.connect()
        pending = threading.Semaphore(GET_WINDOW)
        asked = collections.deque()  # key index of each unanswered get, in order
        failed = []

        def reader():
            buf, hit = bytearray(), False
            try:
                while True:
                    line = read_line(s, buf)
                    if line.startswith(b"VALUE"):
                        n = int(line.split()[3])
                        while len(buf) < n + 2:
                            chunk = s.recv(65536)
                            if not chunk:
                                raise OSError("connection closed")
                            buf += chunk
                        del buf[:n + 2]
                        hit = True
                        continue
                    if line == b"END":
                        k = asked.popleft()
                        if not hit:
                            raise OSError(f"k{k} missing right after its set")
                        hit = False
                        self.resume = k + 1
                        pending.release()
                        continue
                    raise OSError(f"writer got {line!r}")
            except (OSError, IndexError) as e:
                failed.append(OSError(str(e)))
                for _ in range(GET_WINDOW):
                    pending.release()

        def ask(k):
            if not pending.acquire(timeout=max(1.0, self.deadline - time.monotonic())):
                raise OSError("no answer to a progress get")
            if failed:
                raise failed[0]
            asked.append(k)
            s.sendall(b"get k%d\r\n" % (k if keys is None else k % keys))

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        since_get = 0
        tail = b" 0 0 %d noreply\r\n" % VALUE_SIZE + self.value + b"\r\n"
        try:
            while i < end and not failed:
                n = min(SET_BATCH, end - i)
                if keys is None:
                    batch = b"".join(b"set k%d%s" % (k, tail) for k in range(i, i + n))
                else:
                    batch = b"".join(b"set k%d%s" % (k % keys, tail) for k in range(i, i + n))
                s.sendall(batch)
                i += n
                since_get += len(batch)
                if since_get >= GET_EVERY or i == end:
                    since_get = 0
                    ask(i - 1)
            # Every get answered (the last one confirms the whole range).
            for _ in range(GET_WINDOW):
                if not pending.acquire(timeout=max(1.0, self.deadline - time.monotonic())):
                    raise OSError("no answer to the last get")
            if failed:
                raise failed[0]
            return end
        finally:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
            t.join(timeout=5)


class ContinuousWriter(threading.Thread):
    """Overwrites k0..k(keys-1) in a loop until stopped (the paused-follower part)."""

    def __init__(self, port, keys, limit_bytes, deadline):
        super().__init__(daemon=True)
        self.w = ItemWriter(port, deadline)
        self.keys, self.limit = keys, limit_bytes
        self.stop = threading.Event()
        self.written = 0
        self.error = None

    def run(self):
        i, chunk = 0, max(1, (64 << 20) // VALUE_SIZE)
        try:
            while not self.stop.is_set() and self.written < self.limit:
                self.w.write(i, chunk, self.keys)
                i += chunk
                self.written += chunk * VALUE_SIZE
        except (Failure, OSError) as e:
            self.error = str(e)


def hold_locks(port, n, tag):
    """TRY n distinct names over LOCK_CONNECTIONS connections to `port`, LOCK_BATCH at a time
    each; returns (open sockets that hold them, seconds, None or what went wrong)."""
    socks = []
    for _ in range(LOCK_CONNECTIONS):
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.settimeout(120)
        socks.append(s)
    errors, granted = [], [0] * LOCK_CONNECTIONS

    def run(c):
        s, buf = socks[c], bytearray()
        try:
            names = range(c, n, LOCK_CONNECTIONS)
            for at in range(0, len(names), LOCK_BATCH):
                chunk = names[at:at + LOCK_BATCH]
                s.sendall(b"".join(frame(OP_TRY, b"%s-%08d" % (tag, k)) for k in chunk))
                for _ in chunk:
                    op = read_frame(s, buf)
                    if op != R_ACQUIRED:
                        raise OSError(f"TRY answered {op}")
                    granted[c] += 1
        except OSError as e:
            errors.append(f"connection {c}: {e}")

    start = time.monotonic()
    threads = [threading.Thread(target=run, args=(c,), daemon=True)
               for c in range(LOCK_CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=FILL_DEADLINE)
        if t.is_alive():
            errors.append(f"not done within {FILL_DEADLINE:.0f} s")
    took = time.monotonic() - start
    # A fill cut short (today's code answering no quorum mid-fill) is reported with what it
    # reached, not dropped.
    return socks, took, (f"{sum(granted):,} granted, then {errors[0]}" if errors else None)


# ---- etcd ----

def etcd_put_all(ports, count, deadline):
    """Put k0..k(count-1) with 1,000-byte values through the JSON gateway, ETCD_CONNECTIONS
    connections spread over `ports`, ETCD_WINDOW requests in flight on each."""
    value = base64.b64encode(b"v" * VALUE_SIZE).decode()
    errors = []

    def run(c):
        port = ports[c % len(ports)]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.settimeout(60)
                buf, inflight = bytearray(), 0
                keys = range(c, count, ETCD_CONNECTIONS)
                for at in range(0, len(keys), ETCD_WINDOW):
                    reqs = []
                    for k in keys[at:at + ETCD_WINDOW]:
                        body = ('{"key":"%s","value":"%s"}'
                                % (base64.b64encode(b"k%d" % k).decode(), value)).encode()
                        reqs.append(b"POST /v3/kv/put HTTP/1.1\r\nHost: etcd\r\nContent-Type: "
                                    b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                                    % (len(body), body))
                    s.sendall(b"".join(reqs))
                    inflight += len(reqs)
                    # Between one and two windows in flight.
                    while inflight > ETCD_WINDOW:
                        http_response(s, buf)
                        inflight -= 1
                    if time.monotonic() > deadline:
                        raise OSError("deadline")
                while inflight:
                    http_response(s, buf)
                    inflight -= 1
        except OSError as e:
            errors.append(f"etcd connection {c}: {e}")

    start = time.monotonic()
    threads = [threading.Thread(target=run, args=(c,), daemon=True)
               for c in range(ETCD_CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.monotonic()))
        if t.is_alive():
            errors.append("etcd: a connection did not finish in time")
    if errors:
        raise Failure(errors[0])
    return time.monotonic() - start


def http_response(s, buf):
    """Read one HTTP/1.1 response (Content-Length or chunked); raise unless it is a 200."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    at = buf.index(b"\r\n\r\n")
    head = bytes(buf[:at]).decode(errors="replace")
    del buf[:at + 4]
    lines = head.split("\r\n")
    if not lines[0].startswith("HTTP/1.1 200"):
        raise OSError(f"etcd answered {lines[0]!r}")
    fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}

    def need(n):
        while len(buf) < n:
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("connection closed")
            buf.extend(chunk)

    if "content-length" in fields:
        n = int(fields["content-length"])
        need(n)
        del buf[:n]
        return
    if fields.get("transfer-encoding", "").lower() == "chunked":
        while True:
            while b"\r\n" not in buf:
                need(len(buf) + 1)
            at = buf.index(b"\r\n")
            size = int(bytes(buf[:at]).split(b";")[0], 16)
            need(at + 2 + size + 2)
            del buf[:at + 2 + size + 2]
            if size == 0:
                return
    raise OSError("etcd response without a length")


# ---- the sub-parts ----

def wait_converged(hf, deadline, nodes=None):
    """Until every node's applied index reaches the largest commit index any reports; the
    seconds it took."""
    nodes = nodes or hf.running()
    start = time.monotonic()
    while time.monotonic() < deadline:
        views = [hf.status(i) for i in nodes]
        if None not in views:
            commit = max(v.get("commit") or 0 for v in views)
            if all((v.get("applied") or 0) >= commit for v in views):
                return time.monotonic() - start
        time.sleep(0.1)
    raise Failure(f"the nodes {nodes} did not converge on one applied index in time")


def leader_of(hf, deadline):
    while time.monotonic() < deadline:
        lead = hf.leader()
        if lead is not None:
            return lead
        time.sleep(0.1)
    raise Failure("no leader agreed by every node")


def probe_figures(lat):
    if not lat:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {"n": len(lat), "p50": quantile(lat, 0.5) * 1000, "p99": quantile(lat, 0.99) * 1000,
            "max": lat[-1] * 1000}


def ms_fmt(v):
    return "-" if v is None else f"{v:,.1f}"


def disk_floor_main(directory, stop, conn):
    """The disk's own latency beside a fill, in a process of its own (no other thread of the
    bench delays it): one 4 KiB append + fdatasync every PROBE_EVERY s to a file in the data
    directories' filesystem. A grant needs a sync on two of the three nodes and the probe waits
    for two grants in a row, so the probe's p99 cannot be much below this one's."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    path = os.path.join(directory, "disk-floor")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    lat, block = [], b"\0" * 4096
    try:
        while not stop.wait(PROBE_EVERY):
            os.write(fd, block)
            t = time.monotonic()
            os.fdatasync(fd)
            lat.append(time.monotonic() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    conn.send((lat, []))
    conn.close()


def monitored(hf, port, body):
    """Run body() with a Monitor on the cluster, a probe on `port` and the disk floor beside
    them; (body's result, monitor, probe latencies, probe errors). The disk floor's sorted
    latencies are left in monitor.disk_floor."""
    mon = Monitor(hf)
    probe = Probe(port)
    floor = Probe(bench_data_dir(hf), disk_floor_main)
    try:
        out = body()
    finally:
        lat, errors = probe.finish()
        mon.disk_floor = floor.finish()[0]
        mon.finish()
    return out, mon, lat, errors


def disk_floor_line(lat, what="the fill"):
    f = probe_figures(lat)
    print()
    print(f"Disk floor beside {what} (a 4 KiB append + fdatasync every "
          f"{PROBE_EVERY * 1000:.0f} ms in the data directories' filesystem; a grant needs a "
          f"sync on two nodes, the probe two grants in a row): n {f['n']:,}, p50 "
          f"{ms_fmt(f['p50'])} ms, p99 {ms_fmt(f['p99'])} ms, max {ms_fmt(f['max'])} ms.")


def node_table(mon, state_bytes=None):
    print()
    print("| node | peak RSS MiB (children incl.) | of it children's own pages, peak MiB "
          "| forked children seen | VmHWM MiB | data dir MiB at the end | data dir peak MiB "
          "| RSS / state |")
    print("|---|---|---|---|---|---|---|---|")
    for i in mon.nodes:
        peak = mon.peak_rss[i] * 1024
        hwm = mon.hwm.get(i)
        r = f"{peak / state_bytes:.2f}x" if state_bytes else "-"
        print(f"| {i} | {mib(peak)} | {mib(mon.peak_children[i] * 1024)} "
              f"| {mon.max_children[i]} | {mib(None if hwm is None else hwm * 1024)} "
              f"| {mib(mon.du_end[i])} | {mib(mon.peak_du[i])} | {r} |")
    print()
    print("Peak RSS is sampled every 100 ms: the node's VmRSS, plus while it has a forked "
          "snapshot child the child's own pages (those the node copied or freed since the "
          "fork, and the child's buffers; read every second, so the copies of a child's "
          "last second are missed: a lower bound). Pages the two share copy-on-write count "
          "once.")


def goals(mon, probe, probe_errors, rss_limit, rss_what):
    seen, counter = mon.leader_changes()
    changes = max(seen, counter or 0)
    nq = mon.no_quorum() + len(probe_errors)
    worst = max(mon.peak_rss.values()) * 1024
    lines = [
        f"zero leader changes: {verdict(changes == 0)} ((term, leader) pairs seen beyond the "
        f"first: {seen}; largest leader-change counter increase: {counter}; leaders seen: "
        f"{', '.join(f'node {n} (term {t})' for t, n in sorted(mon.leaders)) or 'none'})",
        f"zero no-quorum answers: {verdict(nq == 0)} (nodes' counters: {mon.no_quorum()}, probe "
        f"errors: {len(probe_errors)}; fences: {mon.fences()})",
        f"probe p99 <= {GOAL_P99_MS} ms: "
        f"{verdict(probe['p99'] is not None and probe['p99'] <= GOAL_P99_MS)} "
        f"({ms_fmt(probe['p99'])} ms)",
        f"probe max <= {GOAL_MAX_MS} ms: "
        f"{verdict(probe['max'] is not None and probe['max'] <= GOAL_MAX_MS)} "
        f"({ms_fmt(probe['max'])} ms)",
        f"peak RSS per node <= {GOAL_RSS_FACTOR:g}x {rss_what}: "
        f"{verdict(rss_limit is not None and worst <= GOAL_RSS_FACTOR * rss_limit)} "
        f"(worst {mib(worst)} MiB vs {mib(rss_limit)} MiB)",
    ]
    print()
    for g in lines:
        print(f"- goal {g}")
    if probe_errors:
        print(f"- first probe errors: {'; '.join(probe_errors[:3])}")


def print_load(mon):
    b, a = mon.load_before, mon.load_after
    print(f"- load average before {b[0]:.2f} {b[1]:.2f} {b[2]:.2f}, "
          f"after {a[0]:.2f} {a[1]:.2f} {a[2]:.2f}")


def dump_metrics(mon, part):
    """With STATE_METRICS_DIR set, each node's /metrics at the end of a fill, to read the
    nodes' own histograms (log sync, proposal to apply) beside the probe's figures."""
    if not METRICS_DIR:
        return
    os.makedirs(METRICS_DIR, exist_ok=True)
    for i, values in mon.end_metrics.items():
        with open(os.path.join(METRICS_DIR, f"{part}-node{i}.txt"), "w") as f:
            f.writelines(f"{k} {v}\n" for k, v in (values or {}).items())


def items_cluster(procs, base):
    hf = StateCluster(procs, base, "state")
    hf.start_all()
    hf.wait_serving()
    count = STATE_BYTES // VALUE_SIZE
    deadline = time.monotonic() + FILL_DEADLINE
    writer = ItemWriter(hf.mc[1], deadline)
    log(f"state/items: writing {count:,} items of {VALUE_SIZE} B through node 1 "
        f"(--memory {MEMORY_MIB}); probe on node 2")

    def fill():
        # A fill that cannot finish (today's code fencing over and over at a few hundred MiB)
        # is reported with what it reached, not dropped.
        t0 = time.monotonic()
        try:
            took = writer.write(0, count)
            log(f"state/items: written in {took:.1f} s; waiting for every node to apply it")
            return took, took + wait_converged(hf, deadline), None
        except Failure as e:
            log(f"state/items: {e}")
            return time.monotonic() - t0, None, str(e)

    (took, replicated, incomplete), mon, lat, errors = monitored(hf, hf.lockd[2], fill)
    dump_metrics(mon, "items")
    state = max((metric(mon.end_metrics[i], "holdfast_bytes") or 0) for i in mon.nodes)
    evictions = sum(metric(mon.end_metrics[i], "holdfast_evictions_total") or 0
                    for i in mon.nodes)
    return hf, {"took": took, "replicated": replicated, "incomplete": incomplete,
                "mon": mon, "lat": lat,
                "errors": errors, "state": state, "evictions": evictions,
                "reconnects": writer.reconnects, "count": count}


def items_single(procs):
    proc, mc, _ = start_single(procs, "state-single")
    try:
        took = ItemWriter(mc, time.monotonic() + FILL_DEADLINE).write(
            0, STATE_BYTES // VALUE_SIZE)
        rss = proc_status_kib(proc.pid, "VmRSS")
    finally:
        procs.stop(["state-single"])
    return took, rss


def items_etcd(procs, base):
    etcd = EtcdCluster(procs, base, extra=["--quota-backend-bytes", str(4 << 30)])
    etcd.start_all()
    try:
        etcd.wait_serving()
        log("state/items: the same through a 3-node etcd cluster; probe on its node 2")
        probe = Probe(etcd.client[etcd.ids[1]], etcd_probe_main)
        floor = Probe(base, disk_floor_main)
        try:
            took = etcd_put_all([etcd.client[etcd.ids[0]]], STATE_BYTES // VALUE_SIZE,
                                time.monotonic() + FILL_DEADLINE)
        finally:
            lat, errors = probe.finish()
            floor_lat = floor.finish()[0]
        rss = [proc_status_kib(etcd.pid(i), "VmRSS") for i in etcd.ids]
        du = [disk_bytes(etcd.dirs[i]) for i in etcd.ids]
        version = etcd.version()
    finally:
        procs.stop([f"etcd-{i}" for i in etcd.ids])
        for i in etcd.ids:
            shutil_rmtree(etcd.dirs[i])
    return took, rss, du, version, (lat, errors), floor_lat


def shutil_rmtree(path):
    shutil.rmtree(path, ignore_errors=True)


def secs(v):
    return "-" if v is None else f"{v:.1f}"


def mbps(nbytes, seconds):
    return "-" if not seconds else f"{nbytes / seconds / 1e6:,.1f}"


def print_items(r, single, etcd):
    mon, probe = r["mon"], probe_figures(r["lat"])
    n = r["count"] * VALUE_SIZE
    print()
    print(f"State: items. {r['count']:,} items of {VALUE_SIZE} B ({mib(n)} MiB of values) "
          f"written as pipelined `set ... noreply` over one connection to node 1 of a fresh "
          f"3-node cluster (default flags, --memory {MEMORY_MIB}), while a probe times one "
          f"old-protocol TRY + REL on node 2 every {PROBE_EVERY * 1000:.0f} ms (from the TRY's "
          f"send to the RELEASED). Data directories in {bench_data_dir(mon.c)}.")
    print()
    print("| side | write s | MB/s (answered) | s until every node applied it | probe n "
          "| p50 ms | p99 ms | max ms | probe errors | leader changes | no-quorum answers "
          "| state MiB (item bytes) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    seen, counter = mon.leader_changes()
    reached = r["state"] if r["incomplete"] else n  # an incomplete fill: what it reached
    print(f"| 3-node holdfast cluster | {r['took']:.1f} | {mbps(reached, r['took'])} "
          f"| {secs(r['replicated'])} | {probe['n']:,} | {ms_fmt(probe['p50'])} "
          f"| {ms_fmt(probe['p99'])} | {ms_fmt(probe['max'])} | {len(r['errors'])} "
          f"| {max(seen, counter or 0)} | {mon.no_quorum()} | {mib(r['state'])} |")
    if single is not None:
        took, rss = single
        print(f"| one holdfast node | {took:.1f} | {mbps(n, took)} | - | - | - | - | - | - | - "
              f"| - | RSS {mib(None if rss is None else rss * 1024)} |")
    if etcd is not None:
        took, rss, du, version, (elat, eerrors), _ = etcd
        ep = probe_figures(elat)
        print(f"| 3-node etcd cluster ({version}; JSON gateway /v3/kv/put through node 1, "
              f"{ETCD_CONNECTIONS} connections x {ETCD_WINDOW}-{2 * ETCD_WINDOW} in flight; "
              f"probe: a put + a delete on node 2) "
              f"| {took:.1f} | {mbps(n, took)} | - | {ep['n']:,} | {ms_fmt(ep['p50'])} "
              f"| {ms_fmt(ep['p99'])} | {ms_fmt(ep['max'])} | {len(eerrors)} | - | - "
              f"| RSS {'/'.join(mib(None if x is None else x * 1024) for x in rss)}, "
              f"data dir {'/'.join(mib(x) for x in du)} |")
    if r["incomplete"]:
        print()
        print(f"**INCOMPLETE**: the cluster reached {mib(r['state'])} MiB of items of "
              f"{mib(r['count'] * VALUE_SIZE)} in {r['took']:.0f} s, then: {r['incomplete']} "
              f"(its MB/s is of what it reached)")
    disk_floor_line(mon.disk_floor)
    if etcd is not None:
        disk_floor_line(etcd[5], "etcd's fill")
    node_table(mon, r["state"])
    goals(mon, probe, r["errors"], r["state"], "the state (item bytes)")
    print(f"- writer reconnects: {r['reconnects']}; evictions: {r['evictions']}")
    print_load(mon)


def bench_data_dir(hf):
    return os.path.dirname(hf.dirs[hf.ids[0]])


def locks_part(procs, base):
    hf = StateCluster(procs, base, "locks")
    hf.start_all()
    hf.wait_serving()
    deadline = time.monotonic() + FILL_DEADLINE
    log(f"state/locks: {STATE_LOCKS:,} old-protocol locks through node 1; probe on node 2")
    held = []

    def fill():
        socks, took, incomplete = hold_locks(hf.lockd[1], STATE_LOCKS, b"L")
        held.extend(socks)
        if incomplete:
            log(f"state/locks: {incomplete}")
            return took, None, incomplete
        return took, took + wait_converged(hf, deadline), None

    try:
        (took, replicated, incomplete), mon, lat, errors = monitored(hf, hf.lockd[2], fill)
        counts = [metric(mon.end_metrics[i], 'holdfast_locks_held{table="lockd"}')
                  for i in mon.nodes]
        snap = max((metric(mon.end_metrics[i], "holdfast_cluster_snapshot_bytes") or 0)
                   for i in mon.nodes)
    finally:
        for s in held:
            s.close()
        procs.stop([hf.name(i) for i in hf.running()])
    single = None
    if WITH_SINGLE:
        proc, _, lockd = start_single(procs, "locks-single")
        try:
            socks, stook, problem = hold_locks(lockd, STATE_LOCKS, b"L")
            if problem:
                raise Failure(f"locks on one node: {problem}")
            single = (stook, proc_status_kib(proc.pid, "VmRSS"))
            for s in socks:
                s.close()
        finally:
            procs.stop(["locks-single"])
    return {"took": took, "replicated": replicated, "incomplete": incomplete, "mon": mon,
            "lat": lat, "errors": errors,
            "counts": counts, "snap": snap, "single": single}


def print_locks(r):
    mon, probe = r["mon"], probe_figures(r["lat"])
    print()
    print(f"State: locks. {STATE_LOCKS:,} old-protocol locks on distinct names, pipelined TRY "
          f"({LOCK_BATCH} at a time on each of {LOCK_CONNECTIONS} connections to node 1, kept "
          f"open), a fresh 3-node cluster on default flags; the same probe on node 2.")
    print()
    print("| side | fill s | locks/s | s until every node applied it | probe n | p50 ms "
          "| p99 ms | max ms | probe errors | leader changes | no-quorum answers "
          "| locks held per node | snapshot MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    seen, counter = mon.leader_changes()
    reached = STATE_LOCKS
    if r["incomplete"]:
        reached = max((c or 0) for c in r["counts"])
    print(f"| 3-node holdfast cluster | {r['took']:.1f} | {reached / r['took']:,.0f} "
          f"| {secs(r['replicated'])} | {probe['n']:,} | {ms_fmt(probe['p50'])} "
          f"| {ms_fmt(probe['p99'])} | {ms_fmt(probe['max'])} | {len(r['errors'])} "
          f"| {max(seen, counter or 0)} | {mon.no_quorum()} "
          f"| {'/'.join('-' if c is None else f'{c:,}' for c in r['counts'])} "
          f"| {mib(r['snap'])} |")
    single_rss = None
    if r["single"]:
        took, rss = r["single"]
        single_rss = None if rss is None else rss * 1024
        print(f"| one holdfast node | {took:.1f} | {STATE_LOCKS / took:,.0f} | - | - | - | - "
              f"| - | - | - | - | RSS {mib(single_rss)} MiB | - |")
    if r["incomplete"]:
        print()
        print(f"**INCOMPLETE**: {r['incomplete']} (locks/s is of the locks held at the end)")
    disk_floor_line(mon.disk_floor)
    node_table(mon)
    goals(mon, probe, r["errors"], single_rss, "one node's RSS with the same locks")
    print_load(mon)


def snapshot_count(hf, i, seen):
    """Snapshots made by node i: its counter if it has one, else the snap-* names seen in its
    data directory (added to `seen`)."""
    m = metrics(hf.admin[i])
    name = 'holdfast_cluster_snapshots_total{result="made"}'
    made = metric(m, name)
    if made is not None:
        return made, name
    try:
        seen.update(f for f in os.listdir(hf.dirs[i]) if SNAP_FILE.fullmatch(f))
    except OSError:
        pass
    return len(seen), "snap-* files"


def paused_part(hf, count):
    deadline = time.monotonic() + CATCH_UP_DEADLINE + FILL_DEADLINE
    lead = leader_of(hf, deadline)
    follower = max(i for i in hf.running() if i != lead)
    pid = hf.pid(follower)
    seen = set()
    made0, how = snapshot_count(hf, lead, seen)
    seen_before = set(seen)
    log(f"state/paused: SIGSTOP follower {follower}; writing through leader {lead} until it "
        f"has made two snapshots ({how})")
    writer = ContinuousWriter(hf.mc[lead], count, PAUSED_WRITE_FACTOR * STATE_BYTES + (256 << 20),
                              deadline)
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        writer.start()
        made = made0
        while writer.is_alive() and made - made0 < 2:
            time.sleep(0.2)
            made, _ = snapshot_count(hf, lead, seen)
            if how == "snap-* files":
                made = made0 + len(seen - seen_before)
        writer.stop.set()
        writer.join(timeout=120)
        if writer.error:
            raise Failure(f"paused: writer: {writer.error}")
        snaps = made - made0
        target = (hf.status(lead) or {}).get("commit")
        if target is None:
            raise Failure(f"paused: leader {lead} does not answer /cluster")
        mon = Monitor(hf, [lead, follower])
        t0 = time.monotonic()
    finally:
        os.kill(pid, signal.SIGCONT)
    took = None
    try:
        while time.monotonic() < t0 + CATCH_UP_DEADLINE:
            st = hf.status(follower)
            if st and (st.get("applied") or 0) >= target:
                took = time.monotonic() - t0
                break
            time.sleep(0.1)
    finally:
        mon.finish()
    return {"lead": lead, "follower": follower, "snaps": snaps, "how": how,
            "written": writer.written, "paused": t0 - stopped_at, "target": target,
            "took": took, "mon": mon}


def print_paused(r):
    mon = r["mon"]
    print()
    print(f"State: paused follower. On the filled cluster, follower {r['follower']} SIGSTOPped "
          f"for {r['paused']:.1f} s while {mib(r['written'])} MiB were written again (the same "
          f"keys) through leader {r['lead']}, until it had made {r['snaps']} snapshots (counted "
          f"by {r['how']}); then SIGCONT: time until its applied index reached the leader's "
          f"commit index ({r['target']:,}).")
    print()
    print("| catch-up s | leader peak RSS MiB (children incl.) | follower peak RSS MiB "
          "(children incl.) |")
    print("|---|---|---|")
    print(f"| {secs(r['took'])} "
          f"| {mib(mon.peak_rss[r['lead']] * 1024)} "
          f"| {mib(mon.peak_rss[r['follower']] * 1024)} |")
    print()
    ok = r["took"] is not None and r["took"] <= GOAL_CATCH_UP_S
    print(f"- goal catch-up under {GOAL_CATCH_UP_S} s: {verdict(ok)} "
          f"({secs(r['took'])} s; '-': not within {CATCH_UP_DEADLINE:.0f} s)")
    if r["snaps"] < 2:
        print(f"- note: only {r['snaps']} snapshots seen before the writes stopped")
    print_load(mon)


def holdfast_cli(*args, timeout=120):
    try:
        out = subprocess.run([HOLDFAST, "cluster", *args], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    return out.returncode, (out.stdout + out.stderr).strip()


def wiped_part(hf):
    deadline = time.monotonic() + CATCH_UP_DEADLINE
    lead = leader_of(hf, deadline)
    old = max(i for i in hf.running() if i != lead)
    admin = f"127.0.0.1:{hf.admin[lead]}"
    log(f"state/wiped: cluster remove {old}, wipe its data, add it back as a new id")
    code, text = holdfast_cli("remove", str(old), "--admin", admin)
    if code != 0:
        raise Failure(f"wiped: holdfast cluster remove {old}: status {code}: {text}")
    procs = hf.procs
    end = time.monotonic() + 10
    while procs.procs[hf.name(old)].poll() is None and time.monotonic() < end:
        time.sleep(0.1)  # it stops by itself once it applies its removal
    procs.stop([hf.name(old)])
    shutil_rmtree(hf.dirs[old])
    hf.ids.remove(old)
    new = max(hf.ids + [old]) + 1
    hf.add_id(new)
    hf.start(new)
    wait_accepting(hf.admin[new], procs.procs[hf.name(new)], f"node {new}")
    mon = Monitor(hf, [i for i in hf.ids])
    t0 = time.monotonic()
    code, text = holdfast_cli("add", f"{new}=127.0.0.1:{hf.peer[new]}", "--admin", admin)
    added = time.monotonic() - t0
    caught_up = served = None
    try:
        if code != 0:
            log(f"state/wiped: holdfast cluster add: status {code}: {text}")
        while time.monotonic() < t0 + CATCH_UP_DEADLINE and served is None:
            procs.check_alive()
            st, ls = hf.status(new), hf.status(lead)
            if caught_up is None and st and ls and (st.get("applied") or 0) >= ls.get("commit", 0):
                caught_up = time.monotonic() - t0
            if caught_up is not None and lock_round_trip(hf.mc[new], "state-wiped-probe"):
                served = time.monotonic() - t0
            time.sleep(0.1)
    finally:
        mon.finish()
    return {"lead": lead, "old": old, "new": new, "add_code": code, "add_text": text,
            "added": added, "caught_up": caught_up, "served": served, "mon": mon}


def print_wiped(r):
    mon = r["mon"]
    print()
    print(f"State: wiped node. On the filled cluster, `holdfast cluster remove {r['old']}`, its "
          f"data directory wiped, started with --join as node {r['new']}, `holdfast cluster add "
          f"{r['new']}=...` through leader {r['lead']}: time from the add until it has applied "
          f"the leader's commit index and until it grants a lock (memcached set + lock + unlock "
          f"on it).")
    print()
    print("| add command s (status) | applied caught up s | serves s | leader peak RSS MiB "
          "| new node peak RSS MiB | new node data dir MiB (peak) |")
    print("|---|---|---|---|---|---|")
    f = secs
    print(f"| {r['added']:.1f} ({r['add_code']}) | {f(r['caught_up'])} | {f(r['served'])} "
          f"| {mib(mon.peak_rss[r['lead']] * 1024)} | {mib(mon.peak_rss[r['new']] * 1024)} "
          f"| {mib(mon.peak_du[r['new']])} |")
    print()
    ok = r["served"] is not None and r["served"] <= GOAL_CATCH_UP_S
    print(f"- goal serving under {GOAL_CATCH_UP_S} s: {verdict(ok)} ({f(r['served'])} s)")
    if r["add_code"] != 0:
        print(f"- holdfast cluster add: status {r['add_code']}: {r['add_text'][-300:]}")
    print_load(mon)


def run(procs, base):
    """Every sub-part in STATE_PARTS; prints its tables."""
    for path in (HOLDFAST,):
        if not os.path.exists(path):
            raise Failure("build first: cargo build --release --workspace --bins")
    print()
    print(f"State size (STATE_BYTES={STATE_BYTES:,}, STATE_LOCKS={STATE_LOCKS:,}); machine: "
          f"{os.cpu_count()} CPUs (nproc {bench.nproc()}), {bench.cpu_model()}; load average "
          f"{load_average()} at the start.")
    sys_flush()
    if {"items", "paused", "wiped"} & set(STATE_PARTS):
        hf, r = items_cluster(procs, base)
        try:
            single = etcd = None
            if r["incomplete"]:
                paused = wiped = "not run: the fill did not finish"
            elif "paused" in STATE_PARTS:
                paused = failed_or(lambda: paused_part(hf, r["count"]))
            if "wiped" in STATE_PARTS and not r["incomplete"]:
                wiped = failed_or(lambda: wiped_part(hf))
        finally:
            procs.stop([hf.name(i) for i in hf.running()])
            for i in list(hf.dirs):
                shutil_rmtree(hf.dirs[i])
        if "items" in STATE_PARTS and WITH_SINGLE:
            log("state/items: the same through one holdfast node")
            single = items_single(procs)
        if "items" in STATE_PARTS and WITH_ETCD:
            if not os.path.exists(ETCD):
                log("state/items: etcd is not installed (make deps-etcd); no etcd row")
            else:
                etcd = items_etcd(procs, base)
        print_items(r, single, etcd)
        if "paused" in STATE_PARTS:
            print_failed_or(paused, print_paused, "paused follower")
        if "wiped" in STATE_PARTS:
            print_failed_or(wiped, print_wiped, "wiped node")
        sys_flush()
    if "locks" in STATE_PARTS:
        print_locks(locks_part(procs, base))
        sys_flush()


def failed_or(part):
    """part()'s result, or the text of the Failure it raised (the other sub-parts go on)."""
    try:
        return part()
    except Failure as e:
        log(f"state: {e}")
        return str(e)


def print_failed_or(r, printer, what):
    if isinstance(r, str):
        print()
        print(f"State: {what}: FAILED: {r}")
    else:
        printer(r)


def sys_flush():
    sys.stdout.flush()

