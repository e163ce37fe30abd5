"""dlock clients built from protobuf definitions against holdfast: one generated from the
ORIGINAL dlock.proto (a copy of the dlock project's file, unchanged), which must read every reply
as before and skip the fencing-token field it does not know; and one from the same file extended
with `optional uint64 fence = 7;` in Response, which reads the token (docs/protocol.md, "Fencing tokens").
The Python code is generated at test time with grpcio-tools' protoc."""

import importlib
import os
import socket
import struct
import sys

import pytest
from grpc_tools import protoc

from conftest import CLIENT_TIMEOUT_S, start_holdfast, stop_holdfast

HERE = os.path.dirname(os.path.abspath(__file__))


def compile_proto(text, out_dir, module):
    """Write `text` as MODULE.proto in out_dir, compile it, import the generated module."""
    path = os.path.join(out_dir, f"{module}.proto")
    with open(path, "w") as f:
        f.write(text)
    rc = protoc.main(["protoc", f"-I{out_dir}", f"--python_out={out_dir}", path])
    assert rc == 0, f"protoc failed on {module}.proto"
    sys.path.insert(0, out_dir)
    try:
        return importlib.import_module(f"{module}_pb2")
    finally:
        sys.path.remove(out_dir)


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """The native protocol's messages, generated from the repository's proto/holdfast.proto
    under a package of their own."""
    with open(os.path.join(HERE, "..", "..", "proto", "holdfast.proto")) as f:
        text = f.read()
    assert "package dlock;" in text
    text = text.replace("package dlock;", "package holdfast_native;")
    out = tmp_path_factory.mktemp("native")
    return compile_proto(text, str(out), "holdfast_native")


@pytest.fixture(scope="module")
def protos(tmp_path_factory):
    with open(os.path.join(HERE, "dlock.proto")) as f:
        original = f.read()
    assert "fence" not in original, "tests/clients/dlock.proto must stay the original"
    extended = original.replace(
        "optional int64 server_unix_time = 6; // Unix timestamp",
        "optional int64 server_unix_time = 6; // Unix timestamp\n\toptional uint64 fence = 7;")
    # Its own package: both go into protobuf's one default pool (the wire does not name it).
    extended = extended.replace("package dlock;", "package dlock_fenced;")
    assert "fence = 7" in extended and "package dlock_fenced;" in extended
    out = tmp_path_factory.mktemp("proto")
    return (compile_proto(original, str(out), "dlock_original"),
            compile_proto(extended, str(out), "dlock_fenced"))


@pytest.fixture
def dlock_addr():
    base = ["--memcache", "127.0.0.1:0", "--lockd", "off", "--dlock", "127.0.0.1:0",
            "--counter", "off", "--threads", "2"]
    daemon = start_holdfast(base=base, want=("memcache", "dlock"))
    yield daemon.addresses["dlock"]
    stop_holdfast(daemon.proc)


def call(sock, pb, request):
    body = request.SerializeToString()
    sock.sendall(struct.pack(">I", len(body)) + body)
    (length,) = struct.unpack(">I", recv_exact(sock, 4))
    raw = recv_exact(sock, length)
    resp = pb.Response()
    resp.ParseFromString(raw)
    return resp, raw


def recv_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


def lock_request(pb, rid, keys):
    req = pb.Request(id=rid, type=pb.Lock)
    req.lock.keys.extend(keys)
    return req


def test_a_client_built_from_the_original_proto_reads_every_reply_unchanged(protos, dlock_addr):
    original, _ = protos
    with socket.create_connection(dlock_addr, timeout=CLIENT_TIMEOUT_S) as s:
        resp, _ = call(s, original, original.Request(id=1, type=original.Ping))
        assert (resp.version, resp.request_id, resp.status) == (2, 1, original.Ok)
        assert resp.server_unix_time > 1_600_000_000
        resp, raw = call(s, original, lock_request(original, 2, ["job"]))
        assert (resp.request_id, resp.status) == (2, original.Ok)
        # The token is there on the wire, but the original message skips it as unknown: the
        # fields it knows read exactly as before, and re-serialising keeps the unknown field.
        assert not resp.HasField("error_text") and list(resp.keys) == []
        assert resp.SerializeToString() == raw
        # While `s` holds it, another client's try-once gets AcquireTimeout with the busy key.
        with socket.create_connection(dlock_addr, timeout=CLIENT_TIMEOUT_S) as t:
            req = lock_request(original, 3, ["job"])
            req.lock.wait_micro = 0
            resp, _ = call(t, original, req)
            assert resp.status == original.AcquireTimeout and list(resp.keys) == ["job"]


def test_a_client_that_knows_field_7_reads_increasing_fencing_tokens(protos, dlock_addr):
    _, fenced = protos
    tokens = []
    for rid in range(3):
        with socket.create_connection(dlock_addr, timeout=CLIENT_TIMEOUT_S) as s:
            resp, _ = call(s, fenced, lock_request(fenced, rid, ["job", "other"]))
            assert resp.status == fenced.Ok and resp.HasField("fence")
            tokens.append(resp.fence)
            ping, _ = call(s, fenced, fenced.Request(id=99, type=fenced.Ping))
            assert not ping.HasField("fence"), "only a granted Lock carries a token"
    assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens


def read_frame(sock, pb):
    (length,) = struct.unpack(">I", recv_exact(sock, 4))
    resp = pb.Response()
    resp.ParseFromString(recv_exact(sock, length))
    return resp


def test_native_clients_and_an_original_dlock_client_share_keys(protos, native, dlock_addr):
    """Messages generated from holdfast.proto: a shared lock, a watch with its events, a value
    shown by Get, CheckFence, and an original dlock.proto client that conflicts with them."""
    original, _ = protos
    n = native
    with socket.create_connection(dlock_addr, timeout=CLIENT_TIMEOUT_S) as w, \
            socket.create_connection(dlock_addr, timeout=CLIENT_TIMEOUT_S) as a, \
            socket.create_connection(dlock_addr, timeout=CLIENT_TIMEOUT_S) as b, \
            socket.create_connection(dlock_addr, timeout=CLIENT_TIMEOUT_S) as old:
        watch = n.Request(version=3, id=10, type=n.Watch)
        watch.lock.keys.append("cache")
        resp, _ = call(w, n, watch)
        assert (resp.version, resp.status, len(resp.info)) == (3, n.Ok, 1)
        assert resp.info[0].key == "cache" and not resp.info[0].holders

        fences = []
        for sock, rid, value in ((a, 1, b"reader-a"), (b, 2, b"reader-b")):
            req = n.Request(version=3, id=rid, type=n.Lock)
            req.lock.keys.append("cache")
            req.lock.shared = True
            req.lock.value = value
            resp, _ = call(sock, n, req)
            assert (resp.version, resp.request_id, resp.status) == (3, rid, n.Ok)
            fences.append(resp.fence)
            ev = read_frame(w, n)
            assert ev.request_id == 10 and ev.event.kind == n.Acquired
            assert (ev.event.key, ev.event.fence, ev.event.value) == ("cache", resp.fence, value)

        get = n.Request(version=3, id=3, type=n.Get)
        get.lock.keys.append("cache")
        resp, _ = call(a, n, get)
        info = resp.info[0]
        assert info.shared and info.limit == 1
        assert [h.fence for h in info.holders] == fences
        assert [h.value for h in info.holders] == [b"reader-a", b"reader-b"]

        check = n.Request(version=3, id=4, type=n.CheckFence)
        check.lock.keys.append("cache")
        check.lock.fence = fences[0]
        assert call(b, n, check)[0].status == n.Ok
        check.lock.fence = fences[0] + 1000
        assert call(b, n, check)[0].status == n.StaleFence

        # The original client: its Lock conflicts with the shared holders (try once: busy).
        req = lock_request(original, 5, ["cache"])
        req.lock.wait_micro = 0
        resp, _ = call(old, original, req)
        assert (resp.version, resp.status, list(resp.keys)) == (2, original.AcquireTimeout,
                                                                 ["cache"])
        # ... and it never reads a status it does not know: its Lock of a key that native
        # clients use as a semaphore (a limit other than its implied 1) is General, where a
        # native client would read InvalidArgument.
        sem = n.Request(version=3, id=6, type=n.Lock)
        sem.lock.keys.append("pool")
        sem.lock.limit = 3
        assert call(b, n, sem)[0].status == n.Ok
        resp, _ = call(old, original, lock_request(original, 6, ["pool"]))
        assert resp.version == 2 and resp.status == original.General, resp
        assert resp.error_text

        unlock = n.Request(version=3, id=7, type=n.Unlock)
        unlock.lock.keys.append("cache")
        assert call(a, n, unlock)[0].status == n.Ok
        ev = read_frame(w, n)
        assert (ev.event.kind, ev.event.fence) == (n.Released, fences[0])
