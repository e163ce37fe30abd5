#!/usr/bin/env python3
"""Instructions per request of the real daemon, measured with callgrind (stable on a noisy
machine, unlike wall-clock rates).

Runs the release holdfast under `valgrind --tool=callgrind` twice: once serving nothing (start,
stop) and once serving N requests of a workload from this script over loopback, and prints
(Ir(with requests) - Ir(baseline)) / requests. The client is this Python process, outside
valgrind, so only the daemon's instructions are counted (user space; syscalls themselves are not).

usage: tools/instr_per_op.py BINARY [WORKLOAD] [REQUESTS] [CONNS] [DEPTH]
workloads: mc-binary-lock (Lock+Unlock), mc-text-lock, lockd-acq (ACQ+REL), dlock-lock

With HOLDFAST_TLS_CERT, HOLDFAST_TLS_KEY and HOLDFAST_TLS_CA set, the daemon serves TLS
(--tls-cert/--tls-key) and the client speaks TLS: the count then includes the handshakes (the
handshakes are part of the load run: keep REQUESTS large against CONNS).

With INSTR_KEEP set, the callgrind outputs are kept (their folder is printed) for
callgrind_annotate; otherwise they are removed.
"""
import os, re, shutil, signal, socket, ssl, struct, subprocess, sys, tempfile, time

TLS = (os.environ.get("HOLDFAST_TLS_CERT"), os.environ.get("HOLDFAST_TLS_KEY"),
       os.environ.get("HOLDFAST_TLS_CA"))

def start(binary, out):
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           binary, "--memcache", "127.0.0.1:0", "--lockd", "127.0.0.1:0", "--dlock", "127.0.0.1:0", "--counter", "off",
           "--threads", "1"]
    if all(TLS):
        cmd += ["--tls-cert", TLS[0], "--tls-key", TLS[1]]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    addrs = {}
    for _ in range(3):
        line = p.stdout.readline()
        m = re.match(r"holdfast: (\w+) listening on (.*):(\d+)", line)
        addrs[m.group(1)] = int(m.group(3))
    return p, addrs

def stop(p, out):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)
    total = 0
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                total = int(line.split()[1])
    return total

def mc_bin(op, key, opaque=0):
    return struct.pack(">BBHBBHIIQ", 0x80, op, len(key), 0, 0, 0, len(key), opaque, 0) + key

def lockd_frame(op, payload):
    return struct.pack(">I", (1 << 28) | (op << 20) | len(payload)) + payload

def pb_varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80); v >>= 7
    out.append(v); return bytes(out)

def dlock_req(t, key):
    lock = b"\x1a" + pb_varint(len(key)) + key
    body = b"\x08\x02" + b"\x20" + pb_varint(t) + b"\x9a\x03" + pb_varint(len(lock)) + lock
    return struct.pack(">I", len(body)) + body

def pairs(workload, key):
    """(request bytes for one pair, expected reply length of the pair)"""
    if workload == "mc-binary-lock":
        return mc_bin(0x40, key) + mc_bin(0x42, key), 48
    if workload == "mc-text-lock":
        return b"lock " + key + b"\r\nunlock " + key + b"\r\n", 8
    if workload == "lockd-acq":
        p = key + b"\0"
        return lockd_frame(1, p) + lockd_frame(2, p), 2 * (4 + len(p))
    if workload == "dlock-lock":
        return dlock_req(2, key) + dlock_req(3, key), None
    raise SystemExit(f"unknown workload {workload}")

def run_load(addrs, workload, requests, conns, depth):
    proto = {"mc": "memcache", "lockd": "lockd", "dlock": "dlock"}[workload.split("-")[0]]
    socks = [socket.create_connection(("127.0.0.1", addrs[proto])) for _ in range(conns)]
    if all(TLS):
        ctx = ssl.create_default_context(cafile=TLS[2])
        socks = [ctx.wrap_socket(s, server_hostname="127.0.0.1") for s in socks]
    for i, s in enumerate(socks):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if proto == "memcache":  # the item must exist to be locked
            k = b"k%d" % i
            s.sendall(b"set " + k + b" 0 0 1\r\nv\r\n"); s.recv(100)
    pairs_per_conn = requests // 2 // conns
    for i, s in enumerate(socks):
        req, reply_len = pairs(workload, b"k%d" % i)
        left = pairs_per_conn
        while left:
            n = min(depth, left)
            s.sendall(req * n)
            if reply_len is None:  # dlock: count frames
                got = 0; buf = b""
                while got < 2 * n:
                    buf += s.recv(65536)
                    while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                        buf = buf[4 + struct.unpack(">I", buf[:4])[0]:]; got += 1
            else:
                want = reply_len * n; buf = b""
                while len(buf) < want:
                    buf += s.recv(65536)
            left -= n
    for s in socks:
        s.close()
    time.sleep(0.5)
    return pairs_per_conn * conns * 2

def main():
    binary = sys.argv[1]
    workload = sys.argv[2] if len(sys.argv) > 2 else "mc-binary-lock"
    requests = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    conns = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    depth = int(sys.argv[5]) if len(sys.argv) > 5 else 16
    d = tempfile.mkdtemp()
    p, _ = start(binary, f"{d}/base"); time.sleep(0.5); base = stop(p, f"{d}/base")
    p, addrs = start(binary, f"{d}/load"); time.sleep(0.5)
    done = run_load(addrs, workload, requests, conns, depth)
    total = stop(p, f"{d}/load")
    print(f"instr_per_op workload={workload} requests={done} conns={conns} depth={depth} "
          f"baseline_Ir={base} load_Ir={total} per_request={(total - base) / done:.0f}")
    if os.environ.get("INSTR_KEEP"):
        print(f"callgrind outputs kept in {d} (callgrind_annotate {d}/load)")
    else:
        shutil.rmtree(d, ignore_errors=True)

if __name__ == "__main__":
    main()
