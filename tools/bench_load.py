#!/usr/bin/env python3
"""Latency under load (`make bench`'s last part, or alone: `make bench-load`).

One client streams 1,000-byte `set ... noreply` (Redis: SET with CLIENT REPLY OFF), while a
second client, in a process of its own, times one lock and one unlock every 5 ms on its own
connection. The writer runs twice: as fast as the server takes them (its MB/s is the server's
write rate, and a faster server carries more load beside the probe), then paced at the same
rate for every server (250 MB/s by default, below every server's own rate here), which puts the
same load beside every server's probe. Each run starts its server fresh. Servers and probes,
run alternately (A B C ... A B C ...), LOAD_ROUNDS times each:

  holdfast (default flags): the probe in each lock protocol it speaks: memcached text
      (add + delete), memcached binary (add + delete), old (TRY + REL), dlock (Lock + Unlock);
  memcached -t 1 and -t 4: memcached text add + delete;
  redis-server: SET NX PX + DEL.

Reported per server and probe (medians over the rounds): the writer's MB/s and the probe's
p50, p99 and max. Every process started here is stopped by PID, also on an error or Ctrl-C.

Environment (all optional):
  LOAD_SECONDS   measured seconds per run (default 10)
  LOAD_RATES     comma-separated writer rates in MB/s, 0: as fast as the server takes them
                 (default 0,250)
  LOAD_BYTES     bytes the writer sends at most per run (default 0: no limit; every server
                 then gets the same time, whatever its speed)
  LOAD_ROUNDS    runs per server and probe (default 3)
  LOAD_CASES     comma-separated case ids (default: all; see CASES)
  BENCH_HOLDFAST the holdfast binary (default target/release/holdfast)
  BENCH_HOLDFAST_THREADS  holdfast --threads (default: holdfast's own default)
"""

import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import bench
from bench import Failure, Servers, free_port, log, wait_accepting

SECONDS = float(os.environ.get("LOAD_SECONDS", "10"))
MAX_BYTES = int(float(os.environ.get("LOAD_BYTES", "0"))) or float("inf")
ROUNDS = int(os.environ.get("LOAD_ROUNDS", "3"))
PROBE_EVERY = 0.005
PROBE_TIMEOUT = 10.0
VALUE = 1000
# Distinct keys the writer cycles through (64 MB of items: inside every server's default memory).
KEYS = 65536
CHUNK_KEYS = 512
# A paced writer sends smaller chunks (64 KB), so that it is never more than a fraction of a
# millisecond ahead of its rate.
PACED_CHUNK_KEYS = 64
RATES = [float(r) for r in os.environ.get("LOAD_RATES", "0,250").split(",") if r]


# ---- the writer ----

def mc_chunks(per_chunk):
    value = b"v" * VALUE
    for start in range(0, KEYS, per_chunk):
        yield b"".join(b"set load-%d 0 0 %d noreply\r\n%s\r\n" % (k, VALUE, value)
                       for k in range(start, start + per_chunk))


def redis_chunks(per_chunk):
    value = b"v" * VALUE
    for start in range(0, KEYS, per_chunk):
        parts = []
        for k in range(start, start + per_chunk):
            key = b"load-%d" % k
            parts.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
                         % (len(key), key, VALUE, value))
        yield b"".join(parts)


def writer_main(port, redis, rate, ready, stop, conn):
    """Send pipelined writes until `stop` or MAX_BYTES, at `rate` MB/s (0: as fast as the
    server takes them); report (bytes, seconds)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    per_chunk = PACED_CHUNK_KEYS if rate else CHUNK_KEYS
    chunks = list(redis_chunks(per_chunk) if redis else mc_chunks(per_chunk))
    bytes_per_s = rate * 1e6
    s = socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT)
    if redis:
        s.sendall(b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$3\r\nOFF\r\n")
    ready.set()
    sent, i = 0, 0
    start = time.monotonic()
    try:
        while not stop.is_set() and sent < MAX_BYTES:
            if rate:
                ahead = start + sent / bytes_per_s - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            c = chunks[i % len(chunks)]
            s.sendall(c)
            sent += len(c)
            i += 1
    except OSError as e:
        conn.send(("error", str(e)))
        return
    took = time.monotonic() - start
    # The server has taken what the socket accepted; what it still buffers is not counted.
    s.close()
    conn.send(("ok", sent, took))


# ---- the probes: one lock and one unlock on a connection of their own ----

def read_until(sock, buf, want):
    while want not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    i = buf.index(want) + len(want)
    line = bytes(buf[:i])
    del buf[:i]
    return line


def read_exact(sock, buf, n):
    while len(buf) < n:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    out = bytes(buf[:n])
    del buf[:n]
    return out


def probe_mc_text(sock, buf, key):
    sock.sendall(b"add %s 0 0 1\r\nx\r\n" % key)
    if read_until(sock, buf, b"\r\n") != b"STORED\r\n":
        raise OSError("add not stored")
    sock.sendall(b"delete %s\r\n" % key)
    if read_until(sock, buf, b"\r\n") != b"DELETED\r\n":
        raise OSError("delete not done")


def mc_bin(opcode, key, extras=b"", value=b""):
    body = extras + key + value
    return struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), len(extras), 0, 0, len(body),
                       0, 0) + body


def mc_bin_reply(sock, buf):
    head = read_exact(sock, buf, 24)
    status, total = struct.unpack(">H", head[6:8])[0], struct.unpack(">I", head[8:12])[0]
    read_exact(sock, buf, total)
    return status


def probe_mc_binary(sock, buf, key):
    sock.sendall(mc_bin(0x02, key, extras=struct.pack(">II", 0, 0), value=b"x"))  # Add
    if mc_bin_reply(sock, buf) != 0:
        raise OSError("binary add refused")
    sock.sendall(mc_bin(0x04, key))  # Delete
    if mc_bin_reply(sock, buf) != 0:
        raise OSError("binary delete refused")


def old_frame(op, name):
    """An old-protocol request: version 1, the opcode, a NUL-terminated name."""
    payload = name + b"\0"
    return struct.pack(">I", 1 << 28 | op << 20 | len(payload)) + payload


def old_reply(sock, buf):
    h, = struct.unpack(">I", read_exact(sock, buf, 4))
    read_exact(sock, buf, h & 0xFFFFF)
    return h >> 20 & 0xFF


def probe_old(sock, buf, key):
    sock.sendall(old_frame(3, key))  # TRY
    if old_reply(sock, buf) != 128:  # ACQUIRED
        raise OSError("TRY not granted")
    sock.sendall(old_frame(2, key))  # REL
    if old_reply(sock, buf) != 130:  # RELEASED
        raise OSError("REL not done")


def varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def dlock_frame(req_type, key):
    """A dlock (version 2) request: type, and a RequestLock with one key and wait_micro 0."""
    lock = b"\x08\x00" + b"\x1a" + varint(len(key)) + key
    body = b"\x08\x02" + b"\x20" + varint(req_type) + b"\x9a\x03" + varint(len(lock)) + lock
    return struct.pack(">I", len(body)) + body


def read_varint(body, i):
    """The varint at body[i]: (its value, the index after it)."""
    v, shift = 0, 0
    while True:
        b = body[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def dlock_status(sock, buf):
    n, = struct.unpack(">I", read_exact(sock, buf, 4))
    body = read_exact(sock, buf, n)
    i = 0
    while i < len(body):  # field 3 (status) is a varint; absent means Ok
        tag = body[i]
        i += 1
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            v, i = read_varint(body, i)
            if field == 3:
                return v
        elif wire == 2:
            ln, i = read_varint(body, i)
            i += ln
        else:
            raise OSError(f"unexpected wire type {wire}")
    return 0


def probe_dlock(sock, buf, key):
    sock.sendall(dlock_frame(2, key))  # Lock
    if dlock_status(sock, buf) != 0:
        raise OSError("Lock refused")
    sock.sendall(dlock_frame(3, key))  # Unlock
    if dlock_status(sock, buf) != 0:
        raise OSError("Unlock refused")


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def probe_redis(sock, buf, key):
    sock.sendall(resp(b"SET", key, b"x", b"NX", b"PX", b"30000"))
    if read_until(sock, buf, b"\r\n") != b"+OK\r\n":
        raise OSError("SET NX not done")
    sock.sendall(resp(b"DEL", key))
    if read_until(sock, buf, b"\r\n") != b":1\r\n":
        raise OSError("DEL not done")


PROBES = {"mc-text": probe_mc_text, "mc-binary": probe_mc_binary, "old": probe_old,
          "dlock": probe_dlock, "redis": probe_redis}


def probe_main(port, kind, ready, stop, conn):
    """One pair every PROBE_EVERY s until `stop`; sends back (latencies in s, errors)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    once = PROBES[kind]
    key = b"load-probe-%d" % os.getpid()
    sock = socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    lat, errors = [], []
    ready.wait(PROBE_TIMEOUT)
    next_at = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if now < next_at:
            time.sleep(next_at - now)
        next_at = max(next_at + PROBE_EVERY, time.monotonic())
        try:
            sent = time.monotonic()
            once(sock, buf, key)
            lat.append(time.monotonic() - sent)
        except OSError as e:
            errors.append(str(e))
            break
    sock.close()
    conn.send((lat, errors))


# ---- servers and cases ----

def start_holdfast(servers, name):
    _, ports = servers.start_holdfast(name, ("memcache", "lockd", "dlock"))
    return ports


def start_memcached(servers, name, threads):
    port = free_port()
    proc = servers.spawn(name, ["memcached", "-U", "0", "-l", "127.0.0.1", "-p", str(port),
                                "-t", str(threads), "-m", "1024", "-c", "4096", "-u", "nobody"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_accepting(port, proc, name)
    return port


def start_redis(servers, name):
    port = free_port()
    proc = servers.spawn(name, ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                "--save", "", "--appendonly", "no", "--maxmemory", "1gb"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_accepting(port, proc, name)
    return port


# id: (what, start(servers) -> (writer port, probe port), probe kind, writer speaks Redis)
CASES = {
    "holdfast-mc-text": ("holdfast, memcached text add+delete",
                         lambda s: (lambda p: (p["memcache"], p["memcache"]))(
                             start_holdfast(s, "holdfast")), "mc-text", False),
    "holdfast-mc-binary": ("holdfast, memcached binary add+delete",
                           lambda s: (lambda p: (p["memcache"], p["memcache"]))(
                               start_holdfast(s, "holdfast")), "mc-binary", False),
    "holdfast-old": ("holdfast, old TRY+REL",
                     lambda s: (lambda p: (p["memcache"], p["lockd"]))(
                         start_holdfast(s, "holdfast")), "old", False),
    "holdfast-dlock": ("holdfast, dlock Lock+Unlock",
                       lambda s: (lambda p: (p["memcache"], p["dlock"]))(
                           start_holdfast(s, "holdfast")), "dlock", False),
    "memcached-t1": ("memcached -t 1, add+delete",
                     lambda s: (lambda p: (p, p))(start_memcached(s, "memcached", 1)),
                     "mc-text", False),
    "memcached-t4": ("memcached -t 4, add+delete",
                     lambda s: (lambda p: (p, p))(start_memcached(s, "memcached", 4)),
                     "mc-text", False),
    "redis": ("redis-server, SET NX PX + DEL",
              lambda s: (lambda p: (p, p))(start_redis(s, "redis")), "redis", True),
}


def run_case(case_id, rate, logdir):
    what, start, kind, redis = CASES[case_id]
    servers = Servers(logdir)
    try:
        writer_port, probe_port = start(servers)
        ctx = mp.get_context("fork")
        ready, stop = ctx.Event(), ctx.Event()
        w_recv, w_send = ctx.Pipe(False)
        p_recv, p_send = ctx.Pipe(False)
        writer = ctx.Process(target=writer_main,
                             args=(writer_port, redis, rate, ready, stop, w_send))
        probe = ctx.Process(target=probe_main, args=(probe_port, kind, ready, stop, p_send))
        probe.start()
        writer.start()
        try:
            deadline = time.monotonic() + SECONDS + 30
            ready.wait(PROBE_TIMEOUT)
            end = time.monotonic() + SECONDS
            while time.monotonic() < end and writer.is_alive():
                time.sleep(0.05)
            stop.set()
            w = w_recv.recv() if w_recv.poll(max(1, deadline - time.monotonic())) else None
            p = p_recv.recv() if p_recv.poll(max(1, deadline - time.monotonic())) else None
        finally:
            for proc in (writer, probe):
                proc.join(5)
                if proc.is_alive():
                    proc.terminate()  # this child's PID only
                    proc.join(5)
        if w is None or w[0] != "ok":
            return {"failed": f"writer: {w[1] if w else 'no report'}"}
        if p is None:
            return {"failed": "probe: no report"}
        lat, errors = p
        if errors:
            return {"failed": f"probe: {errors[0]}"}
        if len(lat) < 10:
            return {"failed": f"probe: {len(lat)} pairs"}
        lat.sort()
        q = lambda f: lat[min(len(lat) - 1, int(len(lat) * f))] * 1000
        return {"mbs": w[1] / w[2] / 1e6, "p50": q(0.5), "p99": q(0.99), "max": lat[-1] * 1000,
                "pairs": len(lat)}
    finally:
        servers.stop()


def main():
    wanted = [c for c in os.environ.get("LOAD_CASES", "").split(",") if c] or list(CASES)
    unknown = [c for c in wanted if c not in CASES]
    if unknown:
        print(f"bench_load: unknown LOAD_CASES {unknown}; known: {', '.join(CASES)}")
        return 2
    bench.ensure_packages()
    logdir = tempfile.mkdtemp(prefix="holdfast-bench-load-")
    results = {(rate, c): [] for rate in RATES for c in wanted}
    load_before = os.getloadavg()
    try:
        for r in range(ROUNDS):
            for rate in RATES:
                for c in wanted:
                    paced = f" at {rate:g} MB/s" if rate else ""
                    log(f"[load] round {r + 1}/{ROUNDS}: {c}{paced}")
                    results[(rate, c)].append(run_case(c, rate, logdir))
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    load_after = os.getloadavg()
    print()
    print(f"Latency under load: a writer streaming {VALUE}-byte sets (noreply) beside a probe "
          f"timing a lock and an unlock every {PROBE_EVERY * 1000:.0f} ms on its own connection, "
          f"{SECONDS:.0f} s per run, each server fresh, medians of {ROUNDS} alternating rounds. "
          f"Load average {load_before[0]:.1f} before, {load_after[0]:.1f} after.")
    for rate in RATES:
        print()
        print(f"Writer paced at {rate:g} MB/s:" if rate
              else "Writer as fast as the server takes it:")
        print()
        print("| server, probe | writer MB/s | probe p50 ms | probe p99 ms | probe max ms "
              "| notes |")
        print("|---|---|---|---|---|---|")
        for c in wanted:
            runs = results[(rate, c)]
            ok = [x for x in runs if "failed" not in x]
            notes = "; ".join(x["failed"] for x in runs if "failed" in x)
            if not ok:
                print(f"| {CASES[c][0]} | - | - | - | - | {notes} |")
                continue
            med = lambda k: statistics.median(x[k] for x in ok)
            rng = lambda k: f"{min(x[k] for x in ok):.1f}-{max(x[k] for x in ok):.1f}"
            print(f"| {CASES[c][0]} | {med('mbs'):.0f} | {med('p50'):.2f} | {med('p99'):.1f} | "
                  f"{med('max'):.1f} | max {rng('max')}{'; ' + notes if notes else ''} |")
    return 0


def stop_on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop_on_signal)
    try:
        sys.exit(main())
    except Failure as e:
        print(f"bench_load: {e}")
        sys.exit(1)
