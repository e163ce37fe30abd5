#!/usr/bin/env python3
"""Check an installed holdfast (make install DESTDIR=ROOT) as systemd would run it.

1. `systemd-analyze verify` of the installed unit, with ExecStart pointed into ROOT (verify
   checks that the binary exists and is executable): no complaint at all.
2. `systemd-analyze security --offline=yes`: exposure at most MAX_EXPOSURE.
3. Type=notify readiness: the installed daemon, started with $NOTIFY_SOCKET, sends READY=1 only
   after printing every listening line, and STOPPING=1 on SIGTERM, then exits 0.
4. The man page is roff with the flags --help prints.

Usage: verify_service.py ROOT [PREFIX]   (PREFIX defaults to /usr/local)
"""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile

# systemd-analyze security scores 0 (locked down) to 10 (exposed); 2 is "OK" territory.
MAX_EXPOSURE = 2.0
DEADLINE_S = 10


def fail(msg):
    print(f"verify_service: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    root = os.path.abspath(sys.argv[1])
    prefix = sys.argv[2] if len(sys.argv) > 2 else "/usr/local"
    unit = os.path.join(root, prefix.lstrip("/"), "lib/systemd/system/holdfast.service")
    binary = os.path.join(root, prefix.lstrip("/"), "bin/holdfast")
    text = open(unit).read()
    if "@BINDIR@" in text:
        fail("the installed unit still has @BINDIR@")
    for want in ("Type=notify", "DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict"):
        if want not in text:
            fail(f"unit lacks {want}")
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "holdfast.service")
        with open(local, "w") as f:
            f.write(text.replace(f"ExecStart={prefix}/bin/holdfast", f"ExecStart={binary}"))
        r = subprocess.run(["systemd-analyze", "verify", "--man=no", local],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0 or r.stderr.strip():
            fail(f"systemd-analyze verify: rc={r.returncode}\n{r.stderr}")
        r = subprocess.run(["systemd-analyze", "security", "--offline=yes", local],
                           capture_output=True, text=True, timeout=60)
        m = re.search(r"Overall exposure level for holdfast.service: ([0-9.]+)", r.stdout + r.stderr)
        if not m:
            fail(f"no exposure level in:\n{r.stdout}{r.stderr}")
        if float(m.group(1)) > MAX_EXPOSURE:
            fail(f"exposure {m.group(1)} > {MAX_EXPOSURE}")
        print(f"verify_service: systemd-analyze verify clean, exposure {m.group(1)}")
        readiness(binary, os.path.join(tmp, "notify"))
    man = open(os.path.join(root, prefix.lstrip("/"), "share/man/man1/holdfast.1")).read()
    if not man.startswith(".TH HOLDFAST 1"):
        fail("the man page has no .TH header")
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    for flag in re.findall(r"--([a-z-]+)", help_text):
        escaped = "\\-\\-" + flag.replace("-", "\\-")
        if escaped not in man:
            fail(f"the man page does not describe --{flag}")
    print("verify_service: readiness, shutdown and man page ok")


def readiness(binary, path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(DEADLINE_S)
    env = dict(os.environ, NOTIFY_SOCKET=path)
    args = [binary, "--memcache", "127.0.0.1:0", "--lockd", "127.0.0.1:0", "--dlock", "127.0.0.1:0",
            "--counter", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--threads", "1"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        msg = sock.recv(4096).decode()
        if not msg.startswith("READY=1\n") or f"MAINPID={proc.pid}" not in msg:
            fail(f"readiness message {msg!r}")
        # READY=1 is sent after the listening lines are flushed: all five are there already.
        lines = [proc.stdout.readline() for _ in range(5)]
        names = [l.split()[1] for l in lines if "listening on" in l]
        if names != ["memcache", "lockd", "dlock", "counter", "admin"]:
            fail(f"listening lines {lines}")
        proc.send_signal(signal.SIGTERM)  # this PID only
        msg = sock.recv(4096).decode()
        if msg != "STOPPING=1":
            fail(f"stop message {msg!r}")
        rc = proc.wait(DEADLINE_S)
        if rc != 0:
            fail(f"exit status {rc} after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()


if __name__ == "__main__":
    main()
