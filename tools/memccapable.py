#!/usr/bin/env python3
"""libmemcached's conformance tool (memccapable) against holdfast: `make conformance`.

Starts the given holdfast binary with only its memcached listener, on 127.0.0.1 port 0 (the
daemon prints "holdfast: memcache listening on ADDR"), runs `memccapable -h 127.0.0.1 -p PORT -t 5`,
prints its output, stops the daemon by its PID and exits non-zero unless every test passed.

memccapable prints one line per test: the name padded to 40 columns on stdout, then "[pass]" (or
"[skip]") on stdout or "[FAIL]" on stderr, and finally "All tests passed" (stdout) or
"N of M tests failed" (stderr). Both streams are read as one, so each test stays on one line.
"""

import re
import subprocess
import sys
import threading

# How long the daemon may take to print its listening line, and memccapable to run all its tests
# (54 tests that each take milliseconds; -t 5 bounds each I/O wait at 5 s).
START_TIMEOUT_S = 10
RUN_TIMEOUT_S = 300
STOP_TIMEOUT_S = 10

RESULT = re.compile(r"^((?:ascii|binary) .*?)\s*\[(pass|FAIL|skip)\]\s*$")


def start_daemon(binary):
    proc = subprocess.Popen(
        [binary, "--memcache", "127.0.0.1:0", "--lockd", "off", "--dlock", "off", "--counter", "off", "--threads", "2"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    found = {}

    def read_lines():
        for line in proc.stdout:
            m = re.match(r"holdfast: memcache listening on (\S+):(\d+)\s*$", line)
            if m and "port" not in found:
                found["port"] = m.group(2)
                ready.set()
        ready.set()  # EOF: the daemon exited

    ready = threading.Event()
    threading.Thread(target=read_lines, daemon=True).start()
    if not ready.wait(START_TIMEOUT_S) or "port" not in found:
        stop_daemon(proc)
        sys.exit(f"memccapable.py: {binary} did not report its memcache address")
    return proc, found["port"]


def stop_daemon(proc):
    if proc.poll() is None:
        proc.terminate()  # SIGTERM to this PID only
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def parse(output):
    """(passed, failed, skipped, summary_ok) from memccapable's output."""
    passed = failed = skipped = 0
    for line in output.splitlines():
        m = RESULT.match(line)
        if not m:
            continue
        status = m.group(2)
        if status == "pass":
            passed += 1
        elif status == "FAIL":
            failed += 1
        else:
            skipped += 1
    return passed, failed, skipped, "All tests passed" in output


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: memccapable.py PATH/TO/holdfast")
    proc, port = start_daemon(sys.argv[1])
    try:
        try:
            run = subprocess.run(
                ["memccapable", "-h", "127.0.0.1", "-p", port, "-t", "5"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=RUN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            print(out if isinstance(out, str) else out.decode(errors="replace"))
            sys.exit(f"memccapable.py: memccapable did not finish within {RUN_TIMEOUT_S} s")
        alive = proc.poll() is None
    finally:
        stop_daemon(proc)
    print(run.stdout, end="" if run.stdout.endswith("\n") else "\n")
    passed, failed, skipped, summary_ok = parse(run.stdout)
    print(f"memccapable: {passed} passed, {failed} failed")
    ok = run.returncode == 0 and failed == 0 and skipped == 0 and passed > 0 and summary_ok and alive
    if not ok:
        why = []
        if run.returncode != 0:
            why.append(f"exit status {run.returncode}")
        if failed or skipped:
            why.append(f"{failed} failed, {skipped} skipped")
        if not summary_ok:
            why.append('no "All tests passed" line')
        if not alive:
            why.append("the daemon died during the run")
        sys.exit("memccapable.py: conformance failed: " + ", ".join(why or ["no test ran"]))


if __name__ == "__main__":
    main()
