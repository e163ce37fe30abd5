#!/usr/bin/env python3
"""The worked examples of docs/protocol.md ("The native protocol"), run against a real daemon.

Starts `holdfast --dlock 127.0.0.1:0` (the other listeners off), drives it with messages generated
from proto/holdfast.proto and prints every exchange: `a -> Request{...}` for a request sent on
connection `a`, `a <- Response{...}` for a frame read from it (`server_unix_time`, on every
Response, is left out). Each expected status is checked; a surprise stops the script.

    pip install protobuf==5.28.3 grpcio-tools==1.66.2
    python3 tools/native_examples.py [target/release/holdfast]
"""

import importlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_proto():
    """holdfast.proto compiled under another package name (no clash with a dlock.proto)."""
    with open(os.path.join(ROOT, "proto", "holdfast.proto")) as f:
        text = f.read().replace("package dlock;", "package holdfast_native;")
    with tempfile.TemporaryDirectory() as out:
        with open(os.path.join(out, "holdfast_native.proto"), "w") as f:
            f.write(text)
        args = ["protoc", f"-I{out}", f"--python_out={out}", "holdfast_native.proto"]
        assert protoc.main(args) == 0, "protoc failed"
        sys.path.insert(0, out)
        try:
            return importlib.import_module("holdfast_native_pb2")
        finally:
            sys.path.remove(out)


pb = load_proto()


def show(m):
    """A message as `Name{field:value ...}`, fields in number order, enums by name."""
    def value(fd, v):
        if fd.type == fd.TYPE_MESSAGE:
            return "{" + fields(v) + "}"
        if fd.type == fd.TYPE_ENUM:
            return fd.enum_type.values_by_number[v].name
        if isinstance(v, bytes):
            return json.dumps(v.decode("utf-8", "backslashreplace"))
        if isinstance(v, str):
            return json.dumps(v)
        return str(v).lower() if isinstance(v, bool) else str(v)

    def fields(m):
        out = []
        for fd, v in m.ListFields():
            if fd.name == "server_unix_time":
                continue
            if fd.label == fd.LABEL_REPEATED:
                out.append(f"{fd.name}:[" + ", ".join(value(fd, x) for x in v) + "]")
            elif fd.type == fd.TYPE_MESSAGE:
                out.append(fd.name + value(fd, v))
            else:
                out.append(f"{fd.name}:{value(fd, v)}")
        return " ".join(out)

    return type(m).__name__ + "{" + fields(m) + "}"


class Conn:
    def __init__(self, name, port):
        self.name, self.sock = name, socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, id, type, version=3, **lock):
        req = pb.Request(version=version, id=id, type=pb.RequestType.Value(type))
        if lock:
            req.lock.CopyFrom(pb.RequestLock(**lock))
        print(f"{self.name} -> {show(req)}")
        body = req.SerializeToString()
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def read(self, status="Ok", timeout=5.0):
        self.sock.settimeout(timeout)
        length = struct.unpack(">I", self._exactly(4))[0]
        resp = pb.Response.FromString(self._exactly(length))
        print(f"{self.name} <- {show(resp)}")
        got = pb.ResponseStatus.Name(resp.status)
        assert got == status, f"expected {status}, got {got}"
        return resp

    def call(self, id, type, status="Ok", **fields):
        self.send(id, type, **fields)
        return self.read(status)

    def silent(self, seconds=0.2):
        self.sock.settimeout(seconds)
        try:
            assert not self.sock.recv(1), "unexpected frame"
        except socket.timeout:
            pass

    def close(self):
        print(f"{self.name} closes its connection")
        self.sock.close()

    def _exactly(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return buf


def example(title):
    print(f"\n## {title}\n")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/holdfast")
    off = ["--memcache", "off", "--lockd", "off", "--counter", "off", "--admin", "off",
           "--log-level", "warn"]
    daemon = subprocess.Popen([binary, "--dlock", "127.0.0.1:0", *off], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        for line in daemon.stdout:
            m = re.search(r"dlock listening on 127\.0\.0\.1:(\d+)", line)
            if m:
                run(int(m.group(1)))
                return
        sys.exit("holdfast exited before listening")
    finally:
        daemon.terminate()
        daemon.wait()


def run(port):
    def conn(name):
        return Conn(name, port)

    example("Versions per connection")
    a, b = conn("a"), conn("b")
    a.call(1, "Ping")
    a.call(2, "Ping", "Version", version=2)
    b.call(1, "Ping", version=2)
    b.call(2, "Ping", "Version", version=3)

    example("Shared lock")
    a, b, c, d = conn("a"), conn("b"), conn("c"), conn("d")
    a.call(1, "Lock", keys=["config"], shared=True)
    b.call(1, "Lock", keys=["config"], shared=True)
    c.send(1, "Lock", keys=["config"])
    c.call(2, "Get", keys=["config"])
    d.call(1, "Lock", "AcquireTimeout", keys=["config"], shared=True, wait_micro=0)
    a.call(2, "Unlock", keys=["config"])
    b.call(2, "Unlock", keys=["config"])
    c.read()

    example("Semaphore")
    a, b, c = conn("a"), conn("b"), conn("c")
    a.call(1, "Lock", keys=["workers"], limit=2)
    b.call(1, "Lock", keys=["workers"], limit=2)
    c.call(1, "Lock", "AcquireTimeout", keys=["workers"], limit=2, wait_micro=0)
    c.call(2, "Lock", "InvalidArgument", keys=["workers"], limit=3)
    c.send(3, "Lock", keys=["workers"], limit=2)
    a.call(2, "Unlock", keys=["workers"])
    c.read()

    example("Value and Get")
    a, b = conn("a"), conn("b")
    a.call(1, "Lock", keys=["leader"], release_micro=10_000_000, value=b"10.0.0.5:8080")
    b.call(1, "Get", keys=["leader", "nobody"])

    example("Unlock by fence, and the Lost notice")
    a, b = conn("a"), conn("b")
    fence = a.call(7, "Lock", keys=["job"], value=b"host-a").fence
    b.call(1, "Unlock", keys=["job"], fence=fence)
    a.read()
    b.call(2, "Unlock", "NotHeld", keys=["job"], fence=fence)

    example("Extend by fence after a reconnect")
    a = conn("a")
    fence = a.call(1, "Lock", keys=["lease"], release_micro=5_000_000).fence
    a.close()
    a2 = conn("a2")
    a2.call(1, "Extend", keys=["lease"], release_micro=30_000_000, fence=fence)
    a2.call(2, "Get", keys=["lease"])
    a2.call(3, "Unlock", keys=["lease"])

    example("Lock-delay")
    a, b = conn("a"), conn("b")
    b.call(1, "Watch", keys=["db"])
    fence = a.call(1, "Lock", keys=["db"], lock_delay_micro=2_000_000).fence
    b.read()
    a.close()
    b.read()
    b.call(2, "Lock", "AcquireTimeout", keys=["db"], wait_micro=0)
    b.call(3, "Get", keys=["db"])
    start = time.monotonic()
    b.send(4, "Lock", keys=["db"])
    b.read()
    b.read()
    print(f"(granted {time.monotonic() - start:.1f} s after it was sent)")

    example("Watch and Unwatch")
    w, a = conn("w"), conn("a")
    w.call(1, "Watch", keys=["primary"])
    a.call(1, "Lock", keys=["primary"], value=b"a")
    w.read()
    a.call(2, "Unlock", keys=["primary"])
    w.read()
    a.call(3, "Lock", keys=["primary"], release_micro=200_000)
    w.read()
    a.read()
    w.read()
    w.call(2, "Unwatch", keys=["primary"])
    a.call(4, "Lock", keys=["primary"])
    w.silent()

    example("CheckFence")
    a, b, s = conn("a"), conn("b"), conn("s")
    old = a.call(1, "Lock", keys=["blob"], release_micro=100_000).fence
    s.call(1, "CheckFence", keys=["blob"], fence=old)
    a.read()
    new = b.call(1, "Lock", keys=["blob"]).fence
    s.call(2, "CheckFence", "StaleFence", keys=["blob"], fence=old)
    s.call(3, "CheckFence", keys=["blob"], fence=new)

    example("A version-2 client beside native keys")
    n, v2 = conn("n"), conn("v2")
    n.call(1, "Lock", keys=["slots"], limit=3)
    n.call(2, "Lock", keys=["reads"], shared=True)
    v2.call(1, "Lock", "General", version=2, keys=["slots"], wait_micro=0)
    v2.call(2, "Lock", "AcquireTimeout", version=2, keys=["reads"], wait_micro=0)
    v2.call(3, "Unlock", "General", version=2, keys=["reads"])
    v2.call(4, "Get", "InvalidType", version=2, keys=["reads"])

if __name__ == "__main__":
    main()
