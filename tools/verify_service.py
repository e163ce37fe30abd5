#!/usr/bin/env python3
"""Check an installed holdfast (make install DESTDIR=ROOT) as systemd would run it.

1. `systemd-analyze verify` of the installed units, with ExecStart pointed into ROOT (verify
   checks that the binary exists and is executable): no complaint at all. The cluster node's
   template, holdfast@.service, is verified as an instance (holdfast@1.service): verify takes
   no template.
2. `systemd-analyze security --offline=yes`: exposure at most MAX_EXPOSURE, for both.
3. Type=notify readiness: the installed daemon, started with $NOTIFY_SOCKET, sends READY=1 only
   after printing every listening line, and STOPPING=1 on SIGTERM, then exits 0; the same for a
   cluster node started with the template's ExecStart (%i, the state directory and
   $HOLDFAST_ARGS filled in).
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
    unitdir = os.path.join(root, prefix.lstrip("/"), "lib/systemd/system")
    binary = os.path.join(root, prefix.lstrip("/"), "bin/holdfast")
    text = read_unit(os.path.join(unitdir, "holdfast.service"))
    template = read_unit(os.path.join(unitdir, "holdfast@.service"))
    for want in ("StateDirectory=holdfast/%i", "EnvironmentFile=/etc/holdfast/%i.env",
                 "ExecReload=/bin/kill -HUP $MAINPID"):
        if want not in template:
            fail(f"holdfast@.service lacks {want}")
    # The template's start line, for an instance: the installed binary, node 1's state directory.
    m = re.search(r"^ExecStart=(\S+) --data-dir /var/lib/holdfast/%i \$HOLDFAST_ARGS$", template, re.M)
    if not m or m.group(1) != f"{prefix}/bin/holdfast":
        fail("holdfast@.service's ExecStart is not BINDIR/holdfast --data-dir "
             "/var/lib/holdfast/%i $HOLDFAST_ARGS")
    with tempfile.TemporaryDirectory() as tmp:
        exposure = analyze(tmp, "holdfast.service", text, prefix, binary)
        print(f"verify_service: holdfast.service: systemd-analyze verify clean, exposure {exposure}")
        # verify and security want an instance: the template's text under an instance's name.
        exposure = analyze(tmp, "holdfast@1.service", template, prefix, binary)
        print(f"verify_service: holdfast@.service (as holdfast@1.service): systemd-analyze verify "
              f"clean, exposure {exposure}")
        readiness(binary, os.path.join(tmp, "notify"))
        data = os.path.join(tmp, "var/lib/holdfast/1")
        cluster_node = ["--data-dir", data, "--node-id", "1", "--peers", f"1=127.0.0.1:{free_port()}"]
        readiness(binary, os.path.join(tmp, "notify-node"), cluster_node)
        if not os.path.isfile(os.path.join(data, "lock")):
            fail(f"the cluster node did not claim its data directory {data}")
    man = open(os.path.join(root, prefix.lstrip("/"), "share/man/man1/holdfast.1")).read()
    if not man.startswith(".TH HOLDFAST 1"):
        fail("the man page has no .TH header")
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    for flag in re.findall(r"--([a-z-]+)", help_text):
        escaped = "\\-\\-" + flag.replace("-", "\\-")
        if escaped not in man:
            fail(f"the man page does not describe --{flag}")
    print("verify_service: readiness (one node, a cluster node), shutdown and man page ok")


def read_unit(path):
    text = open(path).read()
    if "@BINDIR@" in text:
        fail(f"the installed {os.path.basename(path)} still has @BINDIR@")
    for want in ("Type=notify", "DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict"):
        if want not in text:
            fail(f"{os.path.basename(path)} lacks {want}")
    return text


def analyze(tmp, name, text, prefix, binary):
    """systemd-analyze verify (no complaint at all) and security of `text` saved as tmp/name;
    returns the exposure level."""
    local = os.path.join(tmp, name)
    with open(local, "w") as f:
        f.write(text.replace(f"ExecStart={prefix}/bin/holdfast", f"ExecStart={binary}"))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", local],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or r.stderr.strip():
        fail(f"systemd-analyze verify {name}: rc={r.returncode}\n{r.stderr}")
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", local],
                       capture_output=True, text=True, timeout=60)
    m = re.search(rf"Overall exposure level for {re.escape(name)}: ([0-9.]+)", r.stdout + r.stderr)
    if not m:
        fail(f"no exposure level for {name} in:\n{r.stdout}{r.stderr}")
    if float(m.group(1)) > MAX_EXPOSURE:
        fail(f"{name}: exposure {m.group(1)} > {MAX_EXPOSURE}")
    return m.group(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readiness(binary, path, extra=()):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(DEADLINE_S)
    env = dict(os.environ, NOTIFY_SOCKET=path)
    args = [binary, "--memcache", "127.0.0.1:0", "--lockd", "127.0.0.1:0", "--dlock", "127.0.0.1:0",
            "--counter", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--threads", "1", *extra]
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
