#!/usr/bin/env python3
"""Cluster benchmark: a three-node holdfast cluster against a three-node etcd cluster on loopback
(`make bench-cluster`), leader failover, and memory per held lock.

Three parts (BENCH_PARTS, default all three), and a fourth that runs only when named
(BENCH_PARTS=state, `make bench-cluster-state`: tens of minutes at its full sizes; see
tools/bench_state.py):

- throughput: starts a 3-node etcd cluster (Debian `etcd-server`, `make deps-etcd`), a 3-node
  holdfast cluster (target/release/holdfast with --peers) and a single holdfast node, then runs
  holdfast-bench alternately against them (A B A B ..., BENCH_ROUNDS rounds of BENCH_SECONDS
  each): lock+unlock pairs at BENCH_CONNECTIONS connections, depth 1 and 16, connections spread
  over the three nodes (--server a,b,c). holdfast runs the memcached text lock/unlock workload
  (the one `make bench` uses), etcd the create-if-absent Txn + DeleteRange workload (`-p etcd`);
  the single node runs depth 16 beside them. One markdown table of medians: pairs/s, p99, the
  ratios, the load tool's CPU share (its own rusage from os.wait4 over the round's wall time)
  and each server side's CPU over the round (from /proc/PID/stat).
- failover: FAILOVER_KILLS times (default 20): finds the holdfast leader (GET /cluster on each
  admin port), SIGKILLs it while one client per surviving node loops lock/unlock (memcached text,
  reconnecting on close or no quorum), records the time from the kill to the first grant of a
  lock *sent after* the kill on a survivor, restarts the killed node on its data directory and
  waits until all three serve again. Prints p50/p99/max.
- state: a cluster filled with STATE_BYTES (1 GiB) of items and STATE_LOCKS (5 million) held
  locks while a probe times lock round trips on another node; leader changes, no-quorum
  answers, RSS, data directory sizes; a paused follower and a wiped node catching up.
- memory: holds MEMORY_LOCKS (default 200 000) memcached text locks on distinct names (items
  set first) on a fresh 3-node cluster and on a fresh single node; prints (VmRSS after the locks
  - VmRSS before them) / N for each of the three nodes and for the single node.

Every process it starts is stopped by PID at the end, also on an error or Ctrl-C; every wait has
a deadline and every bench run a timeout. Data directories live in one temporary directory
(same file system as the rest of /tmp), removed at the end unless BENCH_KEEP=1.

Environment (all optional): BENCH_SECONDS (2), BENCH_WARMUP (1), BENCH_ROUNDS (3),
BENCH_CONNECTIONS (50), BENCH_PARTS (throughput,failover,memory), FAILOVER_KILLS (20),
MEMORY_LOCKS (200000), ELECTION_TIMEOUT_MS (holdfast's default, 1000), BENCH_KEEP (0),
BENCH_DATA_DIR (where the temporary directory goes; /dev/shm: every sync on tmpfs).
"""

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (tools/bench.py: free ports, waits, logging, machine description)
from bench import Failure, free_port, log, wait_accepting  # noqa: E402

HOLDFAST = bench.HOLDFAST
BENCH = bench.BENCH
ETCD = shutil.which("etcd") or "/usr/bin/etcd"

SECONDS = float(os.environ.get("BENCH_SECONDS", "2"))
WARMUP = float(os.environ.get("BENCH_WARMUP", "1"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "50"))
PARTS = os.environ.get("BENCH_PARTS", "throughput,failover,memory").split(",")
KILLS = int(os.environ.get("FAILOVER_KILLS", "20"))
MEMORY_LOCKS = int(os.environ.get("MEMORY_LOCKS", "200000"))
ELECTION_TIMEOUT_MS = os.environ.get("ELECTION_TIMEOUT_MS")  # None: holdfast's default
KEEP = os.environ.get("BENCH_KEEP") == "1"
# Where the temporary directory (data directories and logs) goes: BENCH_DATA_DIR=/dev/shm puts
# both clusters' logs on tmpfs, where a sync costs nothing (a diagnosis: how much of the time is
# the disk's); default: the system's temporary directory.
DATA_PARENT = os.environ.get("BENCH_DATA_DIR") or None

# A cluster must elect a leader and serve within this long after its processes started.
CLUSTER_DEADLINE = 30.0
# A bench run may take its own time plus preparation (10 000 keys set through the cluster) and
# drain, plus this margin, then it is killed.
RUN_MARGIN = 60.0
# Failover: a survivor must grant within this long after the kill, or the kill counts as failed
# (and the run stops: something is broken, not slow).
FAILOVER_DEADLINE = 15.0
# Client socket timeout in the failover loop: longer than the no-quorum answer (2 x the election
# timeout) so that a slow election shows as a late grant, not as a timeout.
CLIENT_TIMEOUT = 3.0
# Pause before reconnecting a failover client whose connection closed (a node's no-quorum close).
RECONNECT_PAUSE = 0.01
# Memory: connections the locks are taken over (spread over the nodes) and commands per chunk
# written at once before the replies are read (pipelined).
MEMORY_CONNECTIONS = 6
MEMORY_CHUNK = 2000
# /proc/PID/stat clock ticks.
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Procs:
    """Every process started here, by name, stopped by PID."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = {}

    def spawn(self, name, argv):
        path = os.path.join(self.logdir, f"{name}.log")
        with open(path, "a") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def tail(self, name, lines=3):
        try:
            with open(os.path.join(self.logdir, f"{name}.log")) as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self, name):
        """SIGKILL one process and reap it."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait(timeout=10)

    def check_alive(self):
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise Failure(f"{name} (pid {proc.pid}) died with status {proc.returncode}: "
                              f"{self.tail(name)}")

    def stop(self, names=None):
        names = list(self.procs) if names is None else names
        for name in names:
            if self.procs[name].poll() is None:
                self.procs[name].terminate()
        for name in names:
            proc = self.procs.pop(name)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log(f"{name} (pid {proc.pid}) ignored SIGTERM; killing it")
                proc.kill()
                proc.wait(timeout=5)


def cpu_seconds(pid):
    """User + system CPU seconds of a live process so far (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise Failure(f"no VmRSS for pid {pid}")


def http_get(port, path, timeout=0.5):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.read()


class HoldfastCluster:
    """Three holdfast nodes on loopback, on fixed free ports (a restarted node gets its own
    ports and data directory back)."""

    def __init__(self, procs, datadir, tag):
        self.procs, self.tag = procs, tag
        self.ids = [1, 2, 3]
        self.peer = {i: free_port() for i in self.ids}
        self.mc = {i: free_port() for i in self.ids}
        self.admin = {i: free_port() for i in self.ids}
        self.dirs = {i: os.path.join(datadir, f"{tag}-{i}") for i in self.ids}
        self.peers = ",".join(f"{i}=127.0.0.1:{self.peer[i]}" for i in self.ids)

    def name(self, i):
        return f"{self.tag}-{i}"

    def start(self, i):
        argv = [HOLDFAST, "--peers", self.peers, "--node-id", str(i), "--data-dir", self.dirs[i],
                "--memcache", f"127.0.0.1:{self.mc[i]}", "--lockd", "off", "--dlock", "off",
                "--counter", "off", "--admin", f"127.0.0.1:{self.admin[i]}"]
        if ELECTION_TIMEOUT_MS:
            argv += ["--election-timeout", ELECTION_TIMEOUT_MS]
        return self.procs.spawn(self.name(i), argv)

    def start_all(self):
        for i in self.ids:
            self.start(i)

    def pid(self, i):
        return self.procs.procs[self.name(i)].pid

    def status(self, i):
        try:
            code, body = http_get(self.admin[i], "/cluster")
            return json.loads(body) if code == 200 else None
        except (OSError, ValueError):
            return None

    def leader(self):
        """The node every live node names as leader and that says it is, or None."""
        views = [self.status(i) for i in self.ids if self.name(i) in self.procs.procs]
        if not views or any(v is None for v in views):
            return None
        leaders = {v.get("leader") for v in views}
        if len(leaders) != 1:
            return None
        lead = leaders.pop()
        if lead not in self.ids or self.status(lead).get("role") != "leader":
            return None
        return lead

    def wait_serving(self, nodes=None, deadline=CLUSTER_DEADLINE):
        """Until every node in `nodes` agrees on one leader, is not fenced, and grants a lock."""
        nodes = self.ids if nodes is None else nodes
        end = time.monotonic() + deadline
        pending = set(nodes)
        while time.monotonic() < end:
            self.procs.check_alive()
            if self.leader() is not None:
                for i in sorted(pending):
                    st = self.status(i)
                    if st and not st.get("fenced") and lock_round_trip(self.mc[i], f"probe-{i}"):
                        pending.discard(i)
                if not pending:
                    return
            time.sleep(0.05)
        raise Failure(f"holdfast cluster: nodes {sorted(pending)} not serving within "
                      f"{deadline:.0f} s: {[self.status(i) for i in nodes]}")

    def wait_applied_equal(self, deadline=30.0):
        """Until the three nodes report the same applied index twice in a row."""
        end = time.monotonic() + deadline
        last = None
        while time.monotonic() < end:
            applied = [(self.status(i) or {}).get("applied") for i in self.ids]
            if None not in applied and len(set(applied)) == 1:
                if applied == last:
                    return
                last = applied
            time.sleep(0.2)
        raise Failure("holdfast cluster: replicas did not converge on one applied index")


class EtcdCluster:
    def __init__(self, procs, datadir, extra=()):
        self.procs = procs
        self.extra = list(extra)
        self.ids = [1, 2, 3]
        self.peer = {i: free_port() for i in self.ids}
        self.client = {i: free_port() for i in self.ids}
        self.dirs = {i: os.path.join(datadir, f"etcd-{i}") for i in self.ids}

    def start_all(self):
        initial = ",".join(f"e{i}=http://127.0.0.1:{self.peer[i]}" for i in self.ids)
        for i in self.ids:
            peer, client = f"http://127.0.0.1:{self.peer[i]}", f"http://127.0.0.1:{self.client[i]}"
            self.procs.spawn(f"etcd-{i}", [
                ETCD, "--name", f"e{i}", "--data-dir", self.dirs[i],
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", "holdfast-bench", *self.extra])

    def pid(self, i):
        return self.procs.procs[f"etcd-{i}"].pid

    def wait_serving(self):
        end = time.monotonic() + CLUSTER_DEADLINE
        pending = set(self.ids)
        while time.monotonic() < end:
            self.procs.check_alive()
            for i in sorted(pending):
                try:
                    code, body = http_get(self.client[i], "/health")
                    if code == 200 and json.loads(body).get("health") == "true":
                        pending.discard(i)
                except (OSError, ValueError):
                    pass
            if not pending:
                return
            time.sleep(0.1)
        raise Failure(f"etcd: members {sorted(pending)} not healthy within "
                      f"{CLUSTER_DEADLINE:.0f} s")

    def version(self):
        try:
            out = subprocess.run([ETCD, "--version"], capture_output=True, text=True, timeout=5)
            return out.stdout.splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            return "etcd (version unknown)"


# ---- memcached text client pieces (failover loop, probes, memory) ----

def read_line(sock, buf):
    """One reply line from `sock` (bytes before CRLF); `buf` is a bytearray of leftovers."""
    while True:
        at = buf.find(b"\r\n")
        if at >= 0:
            line = bytes(buf[:at])
            del buf[:at + 2]
            return line
        if len(buf) > 4096:
            raise OSError("reply line too long")
        chunk = sock.recv(4096)
        if not chunk:
            raise OSError("connection closed")
        buf += chunk


def lock_round_trip(port, key, timeout=CLIENT_TIMEOUT):
    """set + lock + unlock of `key` through one node: True if all three succeed."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            buf = bytearray()
            s.sendall(f"set {key} 0 0 1\r\nv\r\nlock {key}\r\nunlock {key}\r\n".encode())
            return [read_line(s, buf) for _ in range(3)] == [b"STORED", b"OK", b"OK"]
    except OSError:
        return False


class Looper(threading.Thread):
    """One failover client: lock/unlock of its own key on one node, in a loop, reconnecting on
    close, timeout or no quorum. After `mark(kill_time)` it records when the first lock sent at
    or after the kill was granted."""

    def __init__(self, port, key):
        super().__init__(daemon=True)
        self.port, self.key = port, key
        self.stop = threading.Event()
        self.kill_time = None
        self.first_grant = None
        self.grants = 0
        self.reconnects = 0
        self.refusals = []  # reply lines that were neither OK nor STORED (first few)

    def mark(self, kill_time):
        self.first_grant = None
        self.kill_time = kill_time

    def run(self):
        while not self.stop.is_set():
            try:
                addr = ("127.0.0.1", self.port)
                with socket.create_connection(addr, timeout=CLIENT_TIMEOUT) as s:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    s.settimeout(CLIENT_TIMEOUT)
                    self.loop(s)
            except OSError:
                pass
            self.reconnects += 1
            self.stop.wait(RECONNECT_PAUSE)

    def loop(self, s):
        buf = bytearray()
        lock, unlock = f"lock {self.key}\r\n".encode(), f"unlock {self.key}\r\n".encode()
        s.sendall(f"set {self.key} 0 0 1\r\nv\r\n".encode())
        if not self.expect(read_line(s, buf), b"STORED"):
            return
        while not self.stop.is_set():
            sent = time.monotonic()
            s.sendall(lock)
            line = read_line(s, buf)
            if not self.expect(line, b"OK"):
                return
            now = time.monotonic()
            self.grants += 1
            if self.kill_time is not None and sent >= self.kill_time and self.first_grant is None:
                self.first_grant = now
            s.sendall(unlock)
            if not self.expect(read_line(s, buf), b"OK"):
                return

    def expect(self, line, want):
        if line == want:
            return True
        if len(self.refusals) < 5:
            self.refusals.append(line.decode(errors="replace"))
        return False


# ---- throughput ----

def run_bench(servers, protocol, pipeline, watch_pids):
    """One holdfast-bench run; its summary fields plus `client_cpu` (the tool's CPU seconds over
    its wall time, from os.wait4) and `server_cpu` (the watched processes' CPU seconds over the
    same wall time, summed)."""
    args = [BENCH, "--server", ",".join(f"127.0.0.1:{p}" for p in servers), "--protocol", protocol,
            "--workload", "lock", "--pipeline", str(pipeline), "--threads", "1",
            "--connections", str(CONNECTIONS), "--duration", str(SECONDS),
            "--warmup", str(WARMUP)]
    with tempfile.TemporaryFile("w+") as out:
        cpu0 = [cpu_seconds(p) for p in watch_pids]
        start = time.monotonic()
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
        deadline = start + SECONDS + WARMUP + RUN_MARGIN
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                return {"failed": f"timed out: {' '.join(args)}"}
            time.sleep(0.02)
        wall = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu1 = [cpu_seconds(p) for p in watch_pids]
        out.seek(0)
        text = out.read()
    summary = [line for line in text.splitlines() if line.startswith("summary ")]
    if not summary:
        lines = text.strip().splitlines()
        return {"failed": lines[-1] if lines else f"exit status {proc.returncode}"}
    fields = dict(kv.split("=", 1) for kv in summary[-1].split()[1:])
    fields["client_cpu"] = (usage.ru_utime + usage.ru_stime) / wall
    if None not in cpu0 and None not in cpu1:
        fields["server_cpu_each"] = [(b - a) / wall for a, b in zip(cpu0, cpu1)]
        fields["server_cpu"] = sum(fields["server_cpu_each"])
    if int(fields.get("errors", "0")) > 0:
        fields["error_lines"] = [line.strip() for line in text.splitlines()
                                 if line.strip().startswith("error:")][:3]
    return fields


def median(results, key):
    values = [float(r[key]) for r in results if "failed" not in r and key in r]
    return statistics.median(values) if values else None


def fmt(v, spec=",.0f"):
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def pct(v):
    return "-" if v is None else f"{100 * v:.0f}%"


def throughput(procs, datadir):
    etcd = EtcdCluster(procs, datadir)
    hf = HoldfastCluster(procs, datadir, "holdfast")
    etcd.start_all()
    hf.start_all()
    single_port = free_port()
    procs.spawn("single", [HOLDFAST, "--memcache", f"127.0.0.1:{single_port}", "--lockd", "off",
                           "--dlock", "off", "--counter", "off", "--admin", "off"])
    etcd.wait_serving()
    hf.wait_serving()
    wait_accepting(single_port, procs.procs["single"], "single holdfast")
    log(f"bench-cluster: etcd clients {list(etcd.client.values())}, holdfast memcache "
        f"{list(hf.mc.values())} (leader {hf.leader()}), single node {single_port}")
    sides = {
        "holdfast": (list(hf.mc.values()), "memcache-text", [hf.pid(i) for i in hf.ids]),
        "etcd": (list(etcd.client.values()), "etcd", [etcd.pid(i) for i in etcd.ids]),
        "single": ([single_port], "memcache-text", [procs.procs["single"].pid]),
    }
    results = {}
    for depth in (1, 16):
        order = ["holdfast", "etcd"] + (["single"] if depth == 16 else [])
        for rnd in range(ROUNDS):
            for side in order:
                log(f"[depth {depth}] round {rnd + 1}/{ROUNDS}: {side}")
                servers, protocol, pids = sides[side]
                r = run_bench(servers, protocol, depth, pids)
                if "failed" in r:
                    log(f"  failed: {r['failed']}")
                else:
                    log(f"  {float(r['rate']):,.0f} pairs/s p99 {float(r['p99_us']):,.0f} us "
                        f"errors {r['errors']} client cpu {pct(r['client_cpu'])} "
                        f"servers cpu {pct(r.get('server_cpu'))} "
                        f"({' '.join(pct(c) for c in r.get('server_cpu_each', []))})")
                results.setdefault((side, depth), []).append(r)
                procs.check_alive()
    leader = hf.leader()
    return results, etcd.version(), leader


def print_throughput(results, etcd_version, leader):
    med = {k: {f: median(v, f) for f in ("rate", "p99_us", "client_cpu", "server_cpu")}
           for k, v in results.items()}
    print()
    print(f"holdfast-bench, {ROUNDS} alternating rounds per side, {SECONDS:g} s each "
          f"(+{WARMUP:g} s warmup), {CONNECTIONS} connections spread over the three nodes, 1 "
          f"client thread; medians. holdfast: memcached text lock+unlock, 3 nodes on default "
          f"flags (election timeout {ELECTION_TIMEOUT_MS or 1000} ms; leader at the end: node "
          f"{leader}); etcd: create-if-absent Txn + DeleteRange through the JSON gateway, "
          f"{etcd_version}, 3 members on default flags; data directories in {data_parent()} "
          f"({filesystem(data_parent())}).")
    print(f"machine: {os.cpu_count()} CPUs (nproc {bench.nproc()}), {bench.cpu_model()}; "
          f"loopback; load average {load_average()} at the end.")
    print()
    print("| load | holdfast pairs/s | etcd pairs/s | ratio | holdfast p99 us | etcd p99 us "
          "| p99 ratio | bench CPU (holdfast / etcd run) | server CPU (holdfast / etcd) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for depth in (1, 16):
        a, b = med[("holdfast", depth)], med[("etcd", depth)]
        print(f"| 3 nodes, depth {depth}: holdfast cluster vs etcd cluster | {fmt(a['rate'])} "
              f"| {fmt(b['rate'])} | {fmt(ratio(a['rate'], b['rate']), '.1f')} "
              f"| {fmt(a['p99_us'])} | {fmt(b['p99_us'])} "
              f"| {fmt(ratio(a['p99_us'], b['p99_us']), '.2f')} "
              f"| {pct(a['client_cpu'])} / {pct(b['client_cpu'])} "
              f"| {pct(a['server_cpu'])} / {pct(b['server_cpu'])} |")
    a, s = med[("holdfast", 16)], med[("single", 16)]
    print(f"| depth 16: holdfast cluster vs one holdfast node | {fmt(a['rate'])} "
          f"| {fmt(s['rate'])} (single) | {fmt(ratio(a['rate'], s['rate']), '.2f')} "
          f"| {fmt(a['p99_us'])} | {fmt(s['p99_us'])} (single) "
          f"| {fmt(ratio(a['p99_us'], s['p99_us']), '.2f')} "
          f"| {pct(a['client_cpu'])} / {pct(s['client_cpu'])} (single) "
          f"| {pct(a['server_cpu'])} / {pct(s['server_cpu'])} (single) |")
    print()
    print("pairs/s: lock+unlock pairs per second (one pair = one operation); p99 per pair from "
          "its intended send time. bench CPU: the load tool's user+system CPU (os.wait4 rusage) "
          "over its wall time (one thread: 100% is one core). server CPU: the three nodes' (or "
          "the single node's) CPU over the same wall time, summed (200% is both cores).")
    goals = []
    for depth in (1, 16):
        a, b = med[("holdfast", depth)], med[("etcd", depth)]
        r = ratio(a["rate"], b["rate"])
        ok = r is not None and r >= 10 and a["p99_us"] is not None and b["p99_us"] is not None \
            and a["p99_us"] < b["p99_us"]
        goals.append(f"depth {depth}: >= 10x etcd's pairs/s with a lower p99: "
                     f"{'met' if ok else 'MISSED'} ({fmt(r, '.1f')}x, p99 {fmt(a['p99_us'])} vs "
                     f"{fmt(b['p99_us'])} us)")
    r = ratio(med[("holdfast", 16)]["rate"], med[("single", 16)]["rate"])
    goals.append(f"depth 16: cluster >= 1/4 of one node: {'met' if r and r >= 0.25 else 'MISSED'} "
                 f"({fmt(r, '.2f')})")
    print()
    for g in goals:
        print(f"- goal {g}")
    problems = []
    for (side, depth), rs in sorted(results.items()):
        for r in rs:
            if "failed" in r:
                problems.append(f"{side} depth {depth}: run failed: {r['failed']}")
            elif int(r.get("errors", "0")) > 0:
                problems.append(f"{side} depth {depth}: {r['errors']} errors: "
                                + "; ".join(r.get("error_lines", [])))
    return problems


# ---- failover ----

def failover(procs, datadir):
    hf = HoldfastCluster(procs, datadir, "failover")
    hf.start_all()
    hf.wait_serving()
    times, notes, elected_after, both_after = [], [], [], []
    for n in range(KILLS):
        procs.check_alive()
        end = time.monotonic() + CLUSTER_DEADLINE
        leader = hf.leader()
        while leader is None and time.monotonic() < end:
            time.sleep(0.05)
            leader = hf.leader()
        if leader is None:
            raise Failure("failover: no leader agreed by all three nodes")
        survivors = [i for i in hf.ids if i != leader]
        loopers = [Looper(hf.mc[i], f"failover-{n}-{i}") for i in survivors]
        for lp in loopers:
            lp.start()
        try:
            # Both clients granted at least a few locks before the kill.
            end = time.monotonic() + 10
            while any(lp.grants < 5 for lp in loopers) and time.monotonic() < end:
                time.sleep(0.01)
            if any(lp.grants < 5 for lp in loopers):
                raise Failure(f"failover: clients on {survivors} not granted before the kill: "
                              f"{[lp.refusals for lp in loopers]}")
            time.sleep(0.2)
            kill_time = time.monotonic()
            for lp in loopers:
                lp.mark(kill_time)
            procs.kill(hf.name(leader))
            end = kill_time + FAILOVER_DEADLINE
            # Until both survivors' clients are granted again (or the deadline); meanwhile, when
            # a survivor's /cluster first says it leads.
            elected = None
            while time.monotonic() < end and any(lp.first_grant is None for lp in loopers):
                if elected is None:
                    for i in survivors:
                        if (hf.status(i) or {}).get("role") == "leader":
                            elected = time.monotonic()
                            break
                time.sleep(0.005)
            firsts = [lp.first_grant for lp in loopers if lp.first_grant is not None]
            if not firsts:
                raise Failure(f"failover: no grant on {survivors} within {FAILOVER_DEADLINE:.0f} "
                              f"s of killing leader {leader}: {[lp.refusals for lp in loopers]}")
            took = min(firsts) - kill_time
            times.append(took)
            elected_after.append(None if elected is None else elected - kill_time)
            both = [lp.first_grant for lp in loopers]
            both_after.append(None if None in both else max(both) - kill_time)
            log(f"failover {n + 1}/{KILLS}: killed leader {leader}; a survivor leads after "
                f"{ms(elected_after[-1])}, first grant after {ms(took)}, both survivors after "
                f"{ms(both_after[-1])}; new leader {hf.leader()}; reconnects "
                f"{[lp.reconnects for lp in loopers]}")
            if None in both:
                notes.append(f"kill {n + 1}: one survivor not granted within "
                             f"{FAILOVER_DEADLINE:.0f} s")
        finally:
            for lp in loopers:
                lp.stop.set()
            for lp in loopers:
                lp.join(timeout=CLIENT_TIMEOUT + 2)
        hf.start(leader)
        hf.wait_serving()
    return times, notes, elected_after, both_after


def ms(seconds):
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def quantile(sorted_values, q):
    """Nearest-rank quantile (p99 of 20 samples is the largest)."""
    idx = max(0, min(len(sorted_values) - 1, -(-int(q * 100) * len(sorted_values) // 100) - 1))
    return sorted_values[idx]


def print_failover(times, notes, elected_after, both_after):
    s = sorted(times)
    print()
    print(f"Failover: {len(s)} SIGKILLs of the leader of a 3-node holdfast cluster (election "
          f"timeout {ELECTION_TIMEOUT_MS or 1000} ms), one memcached text client per survivor "
          f"looping lock/unlock; time from the kill to the first grant of a lock sent after it.")
    print()
    print("p99 by nearest rank (with fewer than 100 kills, the largest).")
    print()
    print("| kills | p50 ms | p99 ms | max ms | min ms |")
    print("|---|---|---|---|---|")
    print(f"| {len(s)} | {quantile(s, 0.5) * 1000:.0f} | {quantile(s, 0.99) * 1000:.0f} "
          f"| {s[-1] * 1000:.0f} | {s[0] * 1000:.0f} |")
    print()
    print(f"- all (ms): {', '.join(f'{t * 1000:.0f}' for t in times)}")
    seen = sorted(e for e in elected_after if e is not None)
    if seen:
        print(f"- a survivor's /cluster said it leads (polled every 5 ms) "
              f"after p50 {quantile(seen, 0.5) * 1000:.0f} ms, max {seen[-1] * 1000:.0f} ms "
              f"({len(seen)} of {len(elected_after)} kills seen): "
              f"{', '.join('-' if e is None else f'{e * 1000:.0f}' for e in elected_after)}")
    back = sorted(b for b in both_after if b is not None)
    if back:
        print(f"- both survivors' clients granted again after p50 {quantile(back, 0.5) * 1000:.0f} "
              f"ms, p99 {quantile(back, 0.99) * 1000:.0f} ms: "
              f"{', '.join('-' if b is None else f'{b * 1000:.0f}' for b in both_after)}")
    p99 = quantile(s, 0.99)
    print(f"- goal failover p99 < 1.5 s: {'met' if p99 < 1.5 else 'MISSED'} ({p99 * 1000:.0f} ms)")
    for n in notes:
        print(f"- {n}")


# ---- memory ----

def open_connections(ports):
    """MEMORY_CONNECTIONS connections spread over `ports` (the locks live as long as they do)."""
    socks = []
    for c in range(MEMORY_CONNECTIONS):
        s = socket.create_connection(("127.0.0.1", ports[c % len(ports)]), timeout=30)
        s.settimeout(30)
        socks.append(s)
    return socks


def pipelined(sock, commands, want, errors):
    """Write commands in chunks, read one reply line per command, each must be `want`; the
    first problem goes to `errors` (this runs on a thread of its own)."""
    buf = bytearray()
    try:
        for at in range(0, len(commands), MEMORY_CHUNK):
            chunk = commands[at:at + MEMORY_CHUNK]
            sock.sendall(b"".join(chunk))
            for _ in chunk:
                line = read_line(sock, buf)
                if line != want:
                    errors.append(f"expected {want!r}, got {line!r}")
                    return
    except OSError as e:
        errors.append(str(e))


def take(socks, n, verb):
    """`set` or `lock` the keys mem-0000000.. over the connections, all at once."""
    per = [[] for _ in socks]
    for k in range(n):
        key = f"mem-{k:07d}"
        cmd = f"set {key} 0 0 1\r\nv\r\n" if verb == "set" else f"lock {key}\r\n"
        per[k % len(socks)].append(cmd.encode())
    want = b"STORED" if verb == "set" else b"OK"
    errors = []
    threads = [threading.Thread(target=pipelined, args=(s, cmds, want, errors), daemon=True)
               for s, cmds in zip(socks, per)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
        if t.is_alive():
            errors.append("a connection did not finish within 600 s")
    if errors:
        raise Failure(f"memory: {verb}: {errors[0]}")


def measure_memory(ports, pids, settle, dirs=None):
    """(RSS per pid at start, after the sets, after the locks) in KiB, and the Raft log files'
    sizes in `dirs` (KiB) after the sets and after the locks."""
    start = [rss_kib(p) for p in pids]
    socks = open_connections(ports)
    try:
        take(socks, MEMORY_LOCKS, "set")
        settle()
        after_set = [rss_kib(p) for p in pids]
        log_set = [log_kib(d) for d in dirs or []]
        take(socks, MEMORY_LOCKS, "lock")
        settle()
        after_lock = [rss_kib(p) for p in pids]
        log_lock = [log_kib(d) for d in dirs or []]
    finally:
        for s in socks:
            s.close()
    return (start, after_set, after_lock), (log_set, log_lock)


def log_kib(path):
    """Bytes of the Raft log files (log.<gen>) in a data directory, in KiB."""
    try:
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                   if f.startswith("log.")) // 1024
    except OSError:
        return None


def memory(procs, datadir):
    hf = HoldfastCluster(procs, datadir, "memory")
    hf.start_all()
    hf.wait_serving()

    def settle_cluster():
        hf.wait_applied_equal()
        time.sleep(1.0)

    cluster, logs = measure_memory([hf.mc[i] for i in hf.ids], [hf.pid(i) for i in hf.ids],
                                   settle_cluster, [hf.dirs[i] for i in hf.ids])
    procs.stop([hf.name(i) for i in hf.ids])
    port = free_port()
    procs.spawn("memory-single", [HOLDFAST, "--memcache", f"127.0.0.1:{port}", "--lockd", "off",
                                  "--dlock", "off", "--counter", "off", "--admin", "off"])
    wait_accepting(port, procs.procs["memory-single"], "single holdfast")
    single, _ = measure_memory([port], [procs.procs["memory-single"].pid],
                               lambda: time.sleep(1.0))
    procs.stop(["memory-single"])
    return cluster, single, logs


def print_memory(cluster, single, logs):
    n = MEMORY_LOCKS
    print()
    print(f"Memory: {n:,} memcached text locks on distinct names (items set first) over "
          f"{MEMORY_CONNECTIONS} connections spread over the nodes; VmRSS, bytes per item and per "
          f"held lock ((after - before) / N).")
    print()
    print("| process | RSS at start KiB | per item B | per held lock B | RSS with the locks KiB "
          "| Raft log file KiB after the sets / the locks |")
    print("|---|---|---|---|---|---|")
    per_lock = []
    for label, runs in (("cluster node", cluster), ("single node", single)):
        start, after_set, after_lock = runs
        for i, (a, b, c) in enumerate(zip(start, after_set, after_lock)):
            item = (b - a) * 1024 / n
            lock = (c - b) * 1024 / n
            name = f"{label} {i + 1}" if label == "cluster node" else label
            per_lock.append((label, lock))
            files = "-"
            if label == "cluster node" and i < len(logs[0]):
                files = f"{fmt(logs[0][i])} / {fmt(logs[1][i])}"
            print(f"| {name} | {a:,} | {item:.0f} | {lock:.0f} | {c:,} | {files} |")
    worst = max(v for l, v in per_lock if l == "cluster node")
    one = [v for l, v in per_lock if l == "single node"][0]
    r = worst / one if one > 0 else None
    print()
    print(f"- goal cluster <= 2x single per held lock: "
          f"{'met' if r is not None and r <= 2 else 'MISSED'} (worst node {worst:.0f} B vs "
          f"{one:.0f} B: {fmt(r, '.2f')}x)")


def data_parent():
    return DATA_PARENT or tempfile.gettempdir()


def filesystem(path):
    """The type of the file system `path` is on (from /proc/mounts: the longest mount prefix)."""
    path, best, kind = os.path.realpath(path), "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                inside = path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")
                if len(parts) > 2 and inside and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def main():
    for path in (HOLDFAST, BENCH):
        if not os.path.exists(path):
            raise Failure("build first: cargo build --release --workspace --bins "
                          "(make bench-cluster does)")
    if "throughput" in PARTS and not os.path.exists(ETCD):
        raise Failure("etcd is not installed: make deps-etcd (Debian etcd-server)")
    if ROUNDS < 3:
        log(f"note: BENCH_ROUNDS={ROUNDS}: fewer than 3 rounds, the medians mean little")
    base = tempfile.mkdtemp(prefix="holdfast-bench-cluster-", dir=DATA_PARENT)
    procs = Procs(base)

    def stop_on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop_on_signal)
    problems = []
    log(f"bench-cluster: load average {load_average()} at the start; logs and data in {base}")
    print(f"load average at the start: {load_average()}")
    try:
        if "throughput" in PARTS:
            results, version, leader = throughput(procs, base)
            procs.stop()
            problems += print_throughput(results, version, leader)
            sys.stdout.flush()
        if "failover" in PARTS:
            times, notes, elected_after, both_after = failover(procs, base)
            procs.stop()
            print_failover(times, notes, elected_after, both_after)
            sys.stdout.flush()
        if "memory" in PARTS:
            cluster, single, logs = memory(procs, base)
            procs.stop()
            print_memory(cluster, single, logs)
            sys.stdout.flush()
        if "state" in PARTS:
            import bench_state  # tools/bench_state.py: the large-state part (minutes)
            bench_state.run(procs, base)
    finally:
        procs.stop()
        if not KEEP:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(f"load average at the end: {load_average()}")
    if problems:
        print()
        print("Problems:")
        for p in problems:
            print(f"- {p}")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        log(f"bench-cluster: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        log("bench-cluster: interrupted; everything it started is stopped")
        sys.exit(130)
