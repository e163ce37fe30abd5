#!/usr/bin/env python3
"""Side-by-side benchmark: holdfast against memcached and redis-server on loopback (`make bench`).

Starts holdfast (the release binary), memcached and redis-server on free loopback ports, runs
identical holdfast-bench loads alternately (A B A B ...) for every row, and prints one markdown
table of medians and ratios. Every process it starts is stopped by PID at the end, also on an
error or Ctrl-C. Everything is bounded: each run has a timeout, each start a deadline.

Environment (all optional):
  BENCH_SECONDS          measured seconds per run (default 5)
  BENCH_WARMUP           warmup seconds per run (default 1)
  BENCH_ROUNDS           runs per side per row (default 3; medians need at least 3)
  BENCH_CONNECTIONS      client connections (default 50)
  BENCH_CLIENT_THREADS   holdfast-bench threads (default 1)
  BENCH_HOLDFAST_THREADS holdfast --threads (default: holdfast's own default, i.e. default flags)
  BENCH_HOLDFAST         the holdfast binary (default: target/release/holdfast), to set one build's
                         ratios beside another's
  BENCH_ROWS             comma-separated row ids to run (default: all; see ROWS, and "fanout":
                         one key, BENCH_FANOUT_WATCHERS (1000) native-protocol watchers, a Lock and
                         an Unlock 500 times after 20 unmeasured: events per second and grant-to-last-event p99)
  BENCH_TLS              0 skips the TLS rows (holdfast and memcached -Z over TLS, each against its
                         own plaintext listener, and new TLS connections per second)
  YRMCDS                 path to a yrmcds binary (cybozu/yrmcds, built by you; nothing here
                         builds it): the counter rows then compare with yrmcds's own counter
                         server; without it they run holdfast alone
"""

import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "target", "release")
HOLDFAST = os.environ.get("BENCH_HOLDFAST") or os.path.join(TARGET, "holdfast")
BENCH = os.path.join(TARGET, "holdfast-bench")
# The native protocol's watch fan-out (tools/fanout/main.rs): the "fanout" row.
FANOUT = os.path.join(TARGET, "holdfast-fanout")
FANOUT_WATCHERS = int(os.environ.get("BENCH_FANOUT_WATCHERS", "1000"))
# Grants per fan-out run: 500 makes its p99 the fifth worst, not one stray sample.
FANOUT_ROUNDS = 500

SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
WARMUP = float(os.environ.get("BENCH_WARMUP", "1"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "50"))
CLIENT_THREADS = int(os.environ.get("BENCH_CLIENT_THREADS", "1"))
HOLDFAST_THREADS = os.environ.get("BENCH_HOLDFAST_THREADS")  # None: holdfast's default
NULL_RESPONDER = os.path.join(TARGET, "examples", "null_responder")
# memcached is run twice, at -t 1 and at its default (-t 4), and each row's baseline is the faster
# of the two in that run: the strongest memcached this machine has.
MEMCACHED_THREADS = {"memcached-t1": ["-t", "1"], "memcached-default": []}

YRMCDS = os.environ.get("YRMCDS")
# A server must accept connections within this long after it was started.
START_DEADLINE = 10.0
# A run may take its own time plus preparation and drain, plus this margin, then it is killed.
RUN_MARGIN = 30.0
# Debian packages of the baselines (openssl makes the TLS rows' certificates).
APT_PACKAGES = {"memcached": "memcached", "redis-server": "redis-server", "openssl": "openssl"}
TLS_ROWS = os.environ.get("BENCH_TLS", "1") != "0"
# memcached over TLS (-Z), at the same thread counts as the plain ones.
MEMCACHED_TLS_THREADS = {"memcached-tls-t1": ["-t", "1"], "memcached-tls-default": []}

# Each row: (id, label, A = holdfast side, B = baseline side). A side is (server, protocol,
# workload, pipeline); server is "holdfast-mc", "holdfast-lockd", "holdfast-dlock", "memcached"
# or "redis". B is None for rows with no baseline (contended).
ROWS = [
    ("bin1", "memcached binary Lock+Unlock, depth 1 vs memcached add+delete",
     ("holdfast-mc", "memcache-binary", "lock", 1), ("memcached", "memcache-binary", "add-delete", 1)),
    ("bin16", "memcached binary Lock+Unlock, depth 16 vs memcached add+delete",
     ("holdfast-mc", "memcache-binary", "lock", 16), ("memcached", "memcache-binary", "add-delete", 16)),
    ("text1", "memcached text lock+unlock, depth 1 vs Redis SET NX PX + DEL",
     ("holdfast-mc", "memcache-text", "lock", 1), ("redis", "redis", "setnx", 1)),
    ("text16", "memcached text lock+unlock, depth 16 vs Redis SET NX PX + DEL",
     ("holdfast-mc", "memcache-text", "lock", 16), ("redis", "redis", "setnx", 16)),
    ("old1", "old ACQ+REL, depth 1 vs memcached add+delete",
     ("holdfast-lockd", "lockd", "lock", 1), ("memcached", "memcache-binary", "add-delete", 1)),
    ("old16", "old ACQ+REL, depth 16 vs memcached add+delete",
     ("holdfast-lockd", "lockd", "lock", 16), ("memcached", "memcache-binary", "add-delete", 16)),
    ("dlock1", "dlock Lock+Unlock, depth 1 vs memcached add+delete",
     ("holdfast-dlock", "dlock", "lock", 1), ("memcached", "memcache-binary", "add-delete", 1)),
    ("dlock16", "dlock Lock+Unlock, depth 16 vs memcached add+delete",
     ("holdfast-dlock", "dlock", "lock", 16), ("memcached", "memcache-binary", "add-delete", 16)),
    # The native protocol's modes against its exclusive Lock (each connection its own key).
    ("native-shared1", "native shared Lock+Unlock, depth 1 vs native exclusive",
     ("holdfast-dlock", "native-shared", "lock", 1), ("holdfast-dlock", "native", "lock", 1)),
    ("native-shared16", "native shared Lock+Unlock, depth 16 vs native exclusive",
     ("holdfast-dlock", "native-shared", "lock", 16), ("holdfast-dlock", "native", "lock", 16)),
    ("native-sem1", "native semaphore (8 slots) Lock+Unlock, depth 1 vs native exclusive",
     ("holdfast-dlock", "native-semaphore", "lock", 1), ("holdfast-dlock", "native", "lock", 1)),
    ("native-sem16", "native semaphore (8 slots) Lock+Unlock, depth 16 vs native exclusive",
     ("holdfast-dlock", "native-semaphore", "lock", 16),
     ("holdfast-dlock", "native", "lock", 16)),
    ("get", "memcached text get (hits), depth 1 vs memcached get",
     ("holdfast-mc", "memcache-text", "get", 1), ("memcached", "memcache-text", "get", 1)),
    ("null16", "memcached text lock+unlock, depth 16 vs a do-nothing responder",
     ("holdfast-mc", "memcache-text", "lock", 16), ("null", "memcache-text", "lock", 16)),
    ("null1", "memcached text lock+unlock, depth 1 vs a do-nothing responder",
     ("holdfast-mc", "memcache-text", "lock", 1), ("null", "memcache-text", "lock", 1)),
    ("counter1", "yrmcds counter Acquire+Release, depth 1 vs yrmcds",
     ("holdfast-counter", "counter", "lock", 1), ("yrmcds", "counter", "lock", 1)),
    ("counter16", "yrmcds counter Acquire+Release, depth 16 vs yrmcds",
     ("holdfast-counter", "counter", "lock", 16), ("yrmcds", "counter", "lock", 16)),
    ("contended", "1000 clients on 10 names, old ACQ (hand-off)",
     ("holdfast-lockd", "lockd", "contended", 1), None),
    # TLS: holdfast's TLS listener (--tls-cert) against memcached -Z, and each against its own
    # plaintext listener; a side whose server name ends in "-tls" speaks TLS.
    ("tls1", "TLS: memcached binary Lock+Unlock, depth 1 vs memcached -Z add+delete",
     ("holdfast-mc-tls", "memcache-binary", "lock", 1),
     ("memcached-tls", "memcache-binary", "add-delete", 1)),
    ("tls16", "TLS: memcached binary Lock+Unlock, depth 16 vs memcached -Z add+delete",
     ("holdfast-mc-tls", "memcache-binary", "lock", 16),
     ("memcached-tls", "memcache-binary", "add-delete", 16)),
    ("tlsplain1", "TLS: holdfast over TLS vs holdfast plain, binary Lock+Unlock, depth 1",
     ("holdfast-mc-tls", "memcache-binary", "lock", 1), ("holdfast-mc", "memcache-binary", "lock", 1)),
    ("tlsplain16", "TLS: holdfast over TLS vs holdfast plain, binary Lock+Unlock, depth 16",
     ("holdfast-mc-tls", "memcache-binary", "lock", 16), ("holdfast-mc", "memcache-binary", "lock", 16)),
    ("mctlsplain16", "TLS: memcached -Z over TLS vs memcached plain, add+delete, depth 16 (context)",
     ("memcached-tls", "memcache-binary", "add-delete", 16),
     ("memcached", "memcache-binary", "add-delete", 16)),
    ("handshakes", "TLS: new connections per second (full handshake + one request), 4 client threads",
     ("holdfast-mc-tls", "memcache-text", "handshakes", 1),
     ("memcached-tls", "memcache-text", "handshakes", 1)),
]


class Failure(Exception):
    pass


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ensure_packages():
    missing = [pkg for cmd, pkg in APT_PACKAGES.items() if shutil.which(cmd) is None]
    if not missing:
        return
    log(f"installing {' '.join(missing)} with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, timeout=600)


def free_port():
    """A port that was free a moment ago (the server binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_accepting(port, proc, name):
    deadline = time.monotonic() + START_DEADLINE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failure(f"{name} exited with status {proc.returncode} at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise Failure(f"{name} did not accept connections on port {port} within {START_DEADLINE:.0f} s")


class Servers:
    """Every process started here, stopped by PID."""

    def __init__(self, logdir):
        self.procs = []  # (name, Popen)
        self.addr = {}
        self.logdir = logdir
        self.logs = {}

    def spawn(self, name, argv, **kw):
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)
        self.procs.append((name, proc))
        return proc

    def make_certificates(self):
        """A CA and a certificate for 127.0.0.1 (openssl, P-256), in the log directory: the key
        0600 for holdfast, a copy the unprivileged memcached user can read."""
        d = self.logdir
        ca_key, ca, key, csr, cert = (os.path.join(d, n) for n in
                                      ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        quiet = dict(check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        subprocess.run(["openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca,
                        "-days", "2", "-subj", "/CN=holdfast bench CA"], **quiet)
        subprocess.run(["openssl", "req", *ec, "-keyout", key, "-out", csr,
                        "-subj", "/CN=127.0.0.1"], **quiet)
        ext = os.path.join(d, "san.ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\n")
        subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key,
                        "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext], **quiet)
        os.chmod(key, 0o600)
        mc_key = os.path.join(d, "server-memcached.key")
        shutil.copyfile(key, mc_key)
        os.chmod(mc_key, 0o644)  # memcached reads it after dropping to nobody
        os.chmod(d, 0o755)
        self.tls_ca, self.tls_cert, self.tls_key, self.tls_mc_key = ca, cert, key, mc_key

    def start_holdfast(self, name, listeners, extra=()):
        """holdfast with the given listeners on port 0; returns its process and {listener: port}
        read from the lines it prints (its output goes to a log file, kept for post-mortems)."""
        args = [HOLDFAST] + (["--threads", HOLDFAST_THREADS] if HOLDFAST_THREADS else [])
        args += list(extra)
        for listener in ("memcache", "lockd", "dlock", "counter"):
            args += [f"--{listener}", "127.0.0.1:0" if listener in listeners else "off"]
        log_path = os.path.join(self.logdir, f"{name}.log")
        with open(log_path, "w") as out:
            proc = self.spawn(name, args, stdout=out, stderr=subprocess.STDOUT)
        self.logs[name] = log_path
        ports = {}
        deadline = time.monotonic() + START_DEADLINE
        while len(ports) < len(listeners):
            if time.monotonic() > deadline:
                raise Failure(f"{name}: no listening lines within {START_DEADLINE:.0f} s")
            if proc.poll() is not None:
                raise Failure(f"{name} exited at start (status {proc.returncode}): {self.tail(name)}")
            with open(log_path) as f:
                for m in re.finditer(r"holdfast: (\w+) listening on 127\.0\.0\.1:(\d+)", f.read()):
                    ports[m.group(1)] = int(m.group(2))
            time.sleep(0.02)
        for port in ports.values():
            wait_accepting(port, proc, name)
        return proc, ports

    def panic(self, name):
        """The panic location and message from a holdfast log, if it panicked."""
        try:
            with open(self.logs[name]) as f:
                lines = f.read().splitlines()
        except (OSError, KeyError):
            return ""
        for i, line in enumerate(lines):
            if "panicked at" in line:
                where = line.split("panicked at", 1)[1].strip().rstrip(":")
                what = lines[i + 1].strip() if i + 1 < len(lines) else ""
                return f"panicked at {where}: {what}"
        return self.tail(name)

    def tail(self, name, lines=3):
        try:
            with open(self.logs[name]) as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except (OSError, KeyError):
            return ""

    def start_all(self):
        _, ports = self.start_holdfast("holdfast", ("memcache", "lockd", "counter"))
        self.addr["holdfast-mc"] = ports["memcache"]
        self.addr["holdfast-lockd"] = ports["lockd"]
        for name, threads in MEMCACHED_THREADS.items():
            port = free_port()
            argv = ["memcached", "-U", "0", "-p", str(port), "-l", "127.0.0.1"] + threads
            if os.geteuid() == 0:
                argv += ["-u", "nobody"]  # memcached refuses to run as root without -u
            proc = self.spawn(name, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_accepting(port, proc, name)
            self.addr[name] = port
        self.addr["holdfast-counter"] = ports["counter"]
        if TLS_ROWS:
            self.make_certificates()
            _, ports = self.start_holdfast(
                "holdfast-tls", ("memcache",), ["--admin", "off", "--tls-cert", self.tls_cert,
                                                "--tls-key", self.tls_key])
            self.addr["holdfast-mc-tls"] = ports["memcache"]
            for name, threads in MEMCACHED_TLS_THREADS.items():
                port = free_port()
                argv = ["memcached", "-U", "0", "-p", str(port), "-l", "127.0.0.1", "-Z", "-o",
                        f"ssl_chain_cert={self.tls_cert},ssl_key={self.tls_mc_key}"] + threads
                if os.geteuid() == 0:
                    argv += ["-u", "nobody"]
                proc = self.spawn(name, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                wait_accepting(port, proc, name)
                self.addr[name] = port
        if YRMCDS:
            self.start_yrmcds()
        port = free_port()
        proc = self.spawn("null-responder", [NULL_RESPONDER, f"127.0.0.1:{port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_accepting(port, proc, "null-responder")
        self.addr["null"] = port
        port = free_port()
        proc = self.spawn(
            "redis-server",
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_accepting(port, proc, "redis-server")
        self.addr["redis"] = port

    def start_yrmcds(self):
        """yrmcds (the binary YRMCDS names) with its counter extension, loopback only, its files
        in the log directory."""
        port, repl, counter = free_port(), free_port(), free_port()
        conf = os.path.join(self.logdir, "yrmcds.conf")
        with open(conf, "w") as f:
            # yrmcds binds the virtual IP and then every bind_ip: without bind_ip it would listen
            # on every interface, and bind_ip equal to the virtual IP fails (address in use).
            # So both are loopback addresses; only 127.0.0.1 is used.
            f.write(f"virtual_ip = \"127.0.0.1\"\nbind_ip = \"127.0.0.2\"\nport = {port}\n"
                    f"repl_port = {repl}\ncounter.enable = true\ncounter.port = {counter}\n"
                    f"temp_dir = \"{self.logdir}\"\n"
                    f"log.file = \"{os.path.join(self.logdir, 'yrmcds.log')}\"\n")
            if HOLDFAST_THREADS:
                # The same worker threads as holdfast; else yrmcds's own default.
                f.write(f"workers = {HOLDFAST_THREADS}\n")
        proc = self.spawn("yrmcds", [YRMCDS, "-f", conf],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_accepting(counter, proc, "yrmcds")
        self.addr["yrmcds"] = counter

    def start_dlock(self):
        """dlock gets its own holdfast: while its lock table is unfinished a Lock may take the
        whole process down, and the other rows must not go down with it."""
        proc, ports = self.start_holdfast("holdfast-dlock", ("dlock",))
        self.addr["holdfast-dlock"] = ports["dlock"]
        return proc

    def check_alive(self):
        for name, proc in self.procs:
            if name != "holdfast-dlock" and proc.poll() is not None:
                raise Failure(f"{name} (pid {proc.pid}) died with status {proc.returncode}: "
                              f"{self.tail(name)}")

    def stop(self):
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log(f"{name} (pid {proc.pid}) ignored SIGTERM; killing it")
                proc.kill()
                proc.wait(timeout=5)
        self.procs.clear()


def run_bench(servers, side, seconds=None, warmup=None, connections=None):
    server, protocol, workload, pipeline = side
    seconds = SECONDS if seconds is None else seconds
    warmup = WARMUP if warmup is None else warmup
    threads = CLIENT_THREADS
    if workload == "handshakes":
        # Handshakes are bound by the client's own crypto: several threads keep the server busy.
        workload, threads = "lock", 4
        extra = ["--handshakes"]
    else:
        extra = []
    args = [BENCH, "--server", f"127.0.0.1:{servers.addr[server]}", "--protocol", protocol,
            "--workload", workload, "--pipeline", str(pipeline), "--threads", str(threads),
            "--duration", str(seconds), "--warmup", str(warmup)] + extra
    if "-tls" in server:
        args += ["--tls", "--tls-ca", servers.tls_ca]
    if extra:
        args += ["--connections", str(threads)]
    elif workload == "contended":
        args += ["--connections", "1000", "--keys", "10"]
    else:
        args += ["--connections", str(connections or CONNECTIONS)]
    try:
        out = subprocess.run(args, capture_output=True, text=True,
                             timeout=seconds + warmup + RUN_MARGIN)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out: {' '.join(args)}"}
    summary = [line for line in out.stdout.splitlines() if line.startswith("summary ")]
    if not summary:
        reason = (out.stderr.strip() or out.stdout.strip()).splitlines()
        return {"failed": reason[-1] if reason else f"exit status {out.returncode}"}
    fields = dict(kv.split("=", 1) for kv in summary[-1].split()[1:])
    if int(fields.get("errors", "0")) > 0:
        shown = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("error:")]
        fields["error_lines"] = shown[:3]
    return fields


def median(results, key):
    values = [float(r[key]) for r in results if "failed" not in r and key in r]
    return statistics.median(values) if values else None


def fmt_rate(v):
    return "-" if v is None else f"{v:,.0f}"


def fmt_us(v):
    return "-" if v is None else f"{v:,.0f}"


def fmt_ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def probe_dlock(servers):
    """One short dlock Lock+Unlock; None if it works, else why not."""
    proc = servers.start_dlock()
    r = run_bench(servers, ("holdfast-dlock", "dlock", "lock", 1), seconds=0.5, warmup=0,
                  connections=1)
    if "failed" in r or int(r.get("errors", "0")) > 0:
        try:
            proc.wait(timeout=2)  # a closed connection may be a process on its way down
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is not None:
        return (f"holdfast exited (status {proc.returncode}) on a dlock Lock "
                f"({servers.panic('holdfast-dlock')})")
    if "failed" in r:
        return r["failed"]
    if int(r.get("errors", "0")) > 0:
        return "; ".join(r.get("error_lines", [])) or "errors"
    return None


def main():
    if not all(os.path.exists(p) for p in (HOLDFAST, BENCH, FANOUT, NULL_RESPONDER)):
        raise Failure("build first: cargo build --release --bins --examples (make bench does)")
    if ROUNDS < 3:
        log(f"note: BENCH_ROUNDS={ROUNDS}: fewer than 3 rounds, the medians mean little")
    ensure_packages()
    wanted = os.environ.get("BENCH_ROWS")
    rows = [r for r in ROWS if not wanted or r[0] in wanted.split(",")]
    if not TLS_ROWS:
        rows = [r for r in rows if not r[0].startswith(("tls", "mctls", "handshakes"))]
    if not YRMCDS:
        # No yrmcds binary: the counter rows run holdfast alone.
        rows = [(i, l, a, None if b and b[0] == "yrmcds" else b) for i, l, a, b in rows]
        log("note: set YRMCDS=/path/to/yrmcds to compare the counter rows with yrmcds")
    logdir = tempfile.mkdtemp(prefix="holdfast-bench-")
    servers = Servers(logdir)

    def stop_on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop_on_signal)
    table = []
    notes = []
    try:
        servers.start_all()
        dlock_problem = None
        if any(r[2][0] == "holdfast-dlock" for r in rows):
            dlock_problem = probe_dlock(servers)
        versions = server_versions()
        for row_id, label, a, b in rows:
            if a[0] == "holdfast-dlock" and dlock_problem:
                table.append((label, None, None, None, None, a, b, f"n/a: {dlock_problem}"))
                continue
            # The baseline sides of this row: both memcacheds for a memcached row.
            bsides = []
            if b is not None:
                names = (list(MEMCACHED_THREADS) if b[0] == "memcached"
                         else list(MEMCACHED_TLS_THREADS) if b[0] == "memcached-tls" else [b[0]])
                bsides = [(n,) + tuple(b[1:]) for n in names]
            # The measured side of a row may itself be memcached (the TLS context row): the
            # faster of its thread counts, as for a baseline.
            asides = ([(n,) + tuple(a[1:]) for n in MEMCACHED_TLS_THREADS]
                      if a[0] == "memcached-tls" else [a])
            ra, rbs = [], {s[0]: [] for s in bsides}
            ras = {s[0]: [] for s in asides}
            for rnd in range(ROUNDS):
                for side in asides:
                    log(f"[{row_id}] round {rnd + 1}/{ROUNDS}: {side[0]}")
                    ras[side[0]].append(run_bench(servers, side))
                    servers.check_alive()
                servers.check_alive()
                for side in bsides:
                    log(f"[{row_id}] round {rnd + 1}/{ROUNDS}: {side[0]}")
                    rbs[side[0]].append(run_bench(servers, side))
                    servers.check_alive()
            best_a = max(ras, key=lambda n: median(ras[n], "rate") or 0)
            ra = ras[best_a]
            a = (best_a,) + tuple(a[1:])
            # The faster baseline (by median rate) stands for the row.
            best = max(rbs, key=lambda n: median(rbs[n], "rate") or 0) if rbs else None
            rb = rbs[best] if best else []
            if best:
                b = (best,) + tuple(b[1:])
            for side, results in list(ras.items()) + list(rbs.items()):
                for r in results:
                    if "failed" in r:
                        notes.append(f"{label} ({side}): run failed: {r['failed']}")
                    elif int(r.get("errors", "0")) > 0:
                        notes.append(f"{label} ({side}): {r['errors']} errors: "
                                     + "; ".join(r.get("error_lines", [])))
            extra = ""
            if a[2] == "contended":
                wpg = median(ra, "wakeups_per_grant")
                extra = f"wake-ups per grant {wpg:.2f}" if wpg is not None else ""
            table.append((label, median(ra, "rate"), median(rb, "rate") if b else None,
                          median(ra, "p99_us"), median(rb, "p99_us") if b else None, a, b, extra))
        fanout = None
        if (not wanted or "fanout" in wanted.split(",")) and not dlock_problem:
            if "holdfast-dlock" not in servers.addr:
                servers.start_dlock()
            fanout = [run_fanout(servers.addr["holdfast-dlock"]) for _ in range(ROUNDS)]
    finally:
        servers.stop()

    print()
    print(f"holdfast-bench, {ROUNDS} alternating rounds per side, {SECONDS:g} s each "
          f"(+{WARMUP:g} s warmup), {CONNECTIONS} connections, {CLIENT_THREADS} client thread(s); "
          f"medians.")
    print(f"machine: {os.cpu_count()} CPUs (nproc {nproc()}), {cpu_model()}; loopback; "
          f"holdfast {'--threads ' + HOLDFAST_THREADS if HOLDFAST_THREADS else 'on default flags'} "
          f"(I/O workers plus its owner thread); memcached the faster of -t 1 and its default "
          f"(-t 4) per row; redis-server (single-threaded); a do-nothing responder "
          f"(examples/null_responder.rs). {versions}")
    print()
    print("| load | holdfast ops/s | baseline ops/s | ratio | holdfast p99 us | baseline p99 us "
          "| p99 ratio | notes |")
    print("|---|---|---|---|---|---|---|---|")
    for label, ra, rb, pa, pb, a, b, extra in table:
        base = f"{b[0]} {b[2]}" if b else "-"
        note = "; ".join(x for x in (f"baseline: {base}" if b else "", extra) if x)
        if a[2] == "contended":
            print(f"| {label} | {fmt_rate(ra)} grants/s | - | - | {fmt_us(pa)} (hand-off) | - | - "
                  f"| {note} |")
        else:
            print(f"| {label} | {fmt_rate(ra)} | {fmt_rate(rb)} | {fmt_ratio(ra, rb)} | {fmt_us(pa)} "
                  f"| {fmt_us(pb)} | {fmt_ratio(pa, pb)} | {note} |")
    print()
    print("Ratios are holdfast / baseline (ops/s: higher is better for holdfast; p99: lower is). "
          "A lock+unlock (or add+delete) pair counts as one operation; latency is per pair from "
          "its intended send time. The client shares the machine with the servers.")
    if fanout:
        runs = [f for f in fanout if "failed" not in f]
        for f in fanout:
            if "failed" in f:
                notes.append(f"watch fan-out: {f['failed']}")
        if runs:
            med = lambda k: sorted(float(f[k]) for f in runs)[len(runs) // 2]
            print()
            print(f"Watch fan-out (native protocol): one key, {FANOUT_WATCHERS} watching "
                  f"connections, a Lock and an Unlock {FANOUT_ROUNDS} times after 20 unmeasured (an event to every watcher each), "
                  f"median of {len(runs)} runs: {med('events_per_s'):,.0f} events/s; from the "
                  f"Lock's send to the last watcher's Acquired event p50 "
                  f"{med('grant_to_last_p50_ms'):.2f} ms, p99 {med('p99_ms'):.2f} ms, "
                  f"max {med('max_ms'):.2f} ms.")
    if notes:
        print()
        print("Problems:")
        for n in notes:
            print(f"- {n}")
        return 1
    return 0


def run_fanout(port):
    """One holdfast-fanout run against the dlock listener at `port`: its key=value figures, or
    {"failed": why}."""
    log(f"[fanout] {FANOUT_WATCHERS} watchers")
    try:
        out = subprocess.run([FANOUT, "--addr", f"127.0.0.1:{port}", "--watchers",
                              str(FANOUT_WATCHERS), "--rounds", str(FANOUT_ROUNDS)],
                             capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"failed": "timed out"}
    if out.returncode != 0:
        return {"failed": (out.stderr or out.stdout).strip()[-300:]}
    return dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)


def nproc():
    try:
        return subprocess.run(["nproc"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def server_versions():
    parts = []
    for argv in (["memcached", "-V"], ["redis-server", "--version"]):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=5).stdout.strip()
            parts.append(out.split(" sha=")[0])
        except (OSError, subprocess.TimeoutExpired):
            pass
    return "; ".join(parts)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        log(f"bench: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        log("bench: interrupted; servers stopped")
        sys.exit(130)
