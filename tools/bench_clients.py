#!/usr/bin/env python3
"""The client libraries side by side (`make bench-clients`).

- The Python client (clients/python, one Client shared by every thread) against redis-py's
  `Lock` (SET NX PX, then its Lua release) on Debian's redis-server, 16 threads using redis-py's
  connection pool: lock+unlock pairs per second and p99 of a pair, from 1 thread and 16 threads.
  Both take a 30 s lease on a key of their own per thread (no contention: the clients' cost is
  measured, not the queueing).
- The Rust client against the raw protocol through target/release/holdfast-client-bench, when
  that binary is built (otherwise its rows are skipped, saying so).

Runs alternate (holdfast, then redis, round after round) so that both see the same machine in
the same minutes; the table shows each row's median over the rounds and the load average.

    BENCH_SECONDS (3)  per run;  BENCH_ROUNDS (3);  HOLDFAST_BIN (target/release/holdfast)
    REDIS_SERVER (redis-server);  CLIENT_BENCH (target/release/holdfast-client-bench)
"""

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

import holdfast  # noqa: E402
import redis  # noqa: E402

SECONDS = float(os.environ.get("BENCH_SECONDS", "3"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
HOLDFAST_BIN = os.environ.get("HOLDFAST_BIN", os.path.join(ROOT, "target", "release", "holdfast"))
REDIS_SERVER = os.environ.get("REDIS_SERVER", "redis-server")
CLIENT_BENCH = os.environ.get("CLIENT_BENCH",
                              os.path.join(ROOT, "target", "release", "holdfast-client-bench"))
THREADS = (1, 16)
LEASE_S = 30
START_TIMEOUT_S = 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_holdfast():
    proc = subprocess.Popen([HOLDFAST_BIN, "--dlock", "127.0.0.1:0", "--memcache", "off",
                             "--lockd", "off", "--counter", "off", "--admin", "off",
                             "--log-level", "warn"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    for line in proc.stdout:
        m = re.match(r"^holdfast: dlock listening on (\S+):(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, f"{m.group(1)}:{m.group(2)}"
        if time.monotonic() > deadline:
            break
    stop(proc)
    sys.exit("bench-clients: holdfast printed no dlock listening line")


def start_redis(tmp):
    port = free_port()
    proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", tmp],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            redis.Redis(port=port).ping()
            return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    stop(proc)
    sys.exit("bench-clients: redis-server did not answer")


def stop(proc):
    if proc.poll() is None:
        proc.terminate()  # this PID only
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def drive(threads, make_pair):
    """Run make_pair(i)() in `threads` threads for SECONDS; (pairs/s, p99 µs)."""
    lat = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def worker(i):
        pair = make_pair(i)
        pair()  # warm (connections, scripts)
        mine = lat[i]
        clock = time.perf_counter
        start.wait()
        while True:
            t0 = clock()
            pair()
            t1 = clock()
            if t1 >= stop_at[0]:
                break
            mine.append(t1 - t0)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    stop_at[0] = time.perf_counter() + 3600
    start.wait()
    began = time.perf_counter()
    stop_at[0] = began + SECONDS
    for t in ts:
        t.join()
    every = sorted(x for xs in lat for x in xs)
    p99 = every[min(len(every) - 1, int(len(every) * 0.99))] * 1e6 if every else 0.0
    return len(every) / SECONDS, p99


def holdfast_run(server, threads):
    client = holdfast.Client([server])
    try:
        def make_pair(i):
            key = f"bench/{i}"

            def pair():
                with client.lock(key, lease=LEASE_S):
                    pass
            return pair
        return drive(threads, make_pair)
    finally:
        client.close()


def redis_run(port, threads):
    pool = redis.BlockingConnectionPool(host="127.0.0.1", port=port, max_connections=threads)
    r = redis.Redis(connection_pool=pool)
    try:
        def make_pair(i):
            lock = r.lock(f"bench/{i}", timeout=LEASE_S)

            def pair():
                if not lock.acquire(blocking=False):
                    raise RuntimeError("redis lock busy")
                lock.release()
            return pair
        return drive(threads, make_pair)
    finally:
        pool.disconnect()


def rust_run(server, threads, mode):
    out = subprocess.run([CLIENT_BENCH, "--server", server, "--threads", str(threads),
                          "--seconds", str(SECONDS), "--mode", mode,
                          "--key-prefix", f"rust-{mode}-{threads}/"],
                         capture_output=True, text=True, timeout=SECONDS * 10 + 60)
    if out.returncode != 0:
        raise RuntimeError(f"holdfast-client-bench failed ({out.returncode}): {out.stderr}")
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    row = json.loads(line)
    return row["pairs_per_s"], row["p99_us"]


def main():
    for need in (HOLDFAST_BIN,):
        if not os.path.exists(need):
            sys.exit(f"bench-clients: {need} missing (make release)")
    if shutil.which(REDIS_SERVER) is None:
        sys.exit(f"bench-clients: {REDIS_SERVER} missing (make deps-bench-clients)")
    rust = os.path.exists(CLIENT_BENCH)
    tmp = tempfile.mkdtemp(prefix="holdfast-bench-clients-")
    hf, server = start_holdfast()
    rd, port = start_redis(tmp)
    results = {}
    load_before = os.getloadavg()
    try:
        for r in range(ROUNDS):
            for threads in THREADS:
                runs = [("python holdfast", lambda: holdfast_run(server, threads)),
                        ("python redis-py Lock", lambda: redis_run(port, threads))]
                if rust:
                    runs += [("rust holdfast-client", lambda: rust_run(server, threads, "client")),
                             ("rust raw protocol", lambda: rust_run(server, threads, "raw"))]
                for name, run in runs:
                    got = run()
                    results.setdefault((name, threads), []).append(got)
                    print(f"round {r + 1} {name:22} {threads:2} threads: {got[0]:9.0f} pairs/s "
                          f"p99 {got[1]:7.0f} us", flush=True)
    finally:
        stop(hf)
        stop(rd)
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()

    def median(name, threads):
        xs = results.get((name, threads))
        if not xs:
            return None
        return statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)

    print()
    print(f"{ROUNDS} rounds of {SECONDS:g} s, alternating; medians. Load average "
          f"(1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
          f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}; "
          f"{os.cpu_count()} CPUs.")
    print()
    print("| client | threads | pairs/s | p99 (µs) | ratio | goal |")
    print("|---|---|---|---|---|---|")
    pairs = [("python holdfast", "python redis-py Lock", {1: 1.0, 16: 1.5})]
    if rust:
        pairs.append(("rust holdfast-client", "rust raw protocol", {1: 0.8}))
    for ours, theirs, goals in pairs:
        for threads in THREADS:
            a, b = median(ours, threads), median(theirs, threads)
            ratio = a[0] / b[0] if b[0] else float("nan")
            goal = goals.get(threads)
            verdict = "" if goal is None else \
                f">= {goal:.1f}x: {'met' if ratio >= goal else 'NOT met'}"
            print(f"| {ours} | {threads} | {a[0]:.0f} | {a[1]:.0f} | {ratio:.2f}x | {verdict} |")
            print(f"| {theirs} | {threads} | {b[0]:.0f} | {b[1]:.0f} | 1.00x | |")
    if not rust:
        print()
        print(f"Rust rows skipped: {CLIENT_BENCH} is not built "
              "(cargo build --release -p holdfast-client).")


if __name__ == "__main__":
    main()
