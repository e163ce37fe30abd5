"""Real TLS clients against holdfast's TLS listeners (`docs/operations.md`,
"Security"): pymemcache with its tls_context, the dlock protobuf client and the old lock
protocol over Python's ssl module, and openssl s_client. The certificates are made here with
trustme; the daemon's key file is written private (mode 0600), as the daemon demands."""

import os
import shutil
import socket
import ssl
import struct
import subprocess

import pytest
import trustme
from pymemcache.client.base import Client as Memcache
from pymemcache.exceptions import MemcacheUnexpectedCloseError

from conftest import CLIENT_TIMEOUT_S, start_holdfast, stop_holdfast
from test_dlock_proto import compile_proto, lock_request, recv_exact

HERE = os.path.dirname(os.path.abspath(__file__))
# How long openssl s_client may take for one handshake.
S_CLIENT_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, the daemon's certificate for 127.0.0.1 and its files, and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_pem = d / "server.pem", d / "server.key", d / "ca.pem"
    server.cert_chain_pems[0].write_to_path(str(cert))
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(str(cert), append=True)
    server.private_key_pem.write_to_path(str(key))
    os.chmod(key, 0o600)
    ca.cert_pem.write_to_path(str(ca_pem))
    client = ca.issue_cert("client@holdfast.test")
    return {"ca": ca, "cert": str(cert), "key": str(key), "ca_pem": str(ca_pem), "client": client}


def client_context(pki, with_cert=False):
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    pki["ca"].configure_trust(ctx)
    if with_cert:
        pki["client"].configure_cert(ctx)
    return ctx


BASE = ["--memcache", "127.0.0.1:0", "--lockd", "127.0.0.1:0", "--dlock", "127.0.0.1:0",
        "--counter", "off", "--admin", "off", "--threads", "2"]


@pytest.fixture
def tls_daemon(pki):
    daemon = start_holdfast("--tls-cert", pki["cert"], "--tls-key", pki["key"], base=BASE,
                            want=("memcache", "lockd", "dlock"))
    yield daemon
    stop_holdfast(daemon.proc)
    assert daemon.proc.returncode == 0, f"holdfast exited with {daemon.proc.returncode} on SIGTERM"


def tls_socket(pki, addr, with_cert=False):
    raw = socket.create_connection(addr, timeout=CLIENT_TIMEOUT_S)
    return client_context(pki, with_cert).wrap_socket(raw, server_hostname=addr[0])


def test_pymemcache_with_tls_context(pki, tls_daemon):
    c = Memcache(tls_daemon.memcache, tls_context=client_context(pki), timeout=CLIENT_TIMEOUT_S)
    assert c.set("k", b"v1")
    assert c.get("k") == b"v1"
    assert c.add("k", b"v2", noreply=False) is False
    assert c.add("fresh", b"x", noreply=False) is True
    big = os.urandom(512 * 1024)
    assert c.set("big", big)
    assert c.get("big") == big
    assert c.get_many(["k", "fresh", "missing"]) == {"k": b"v1", "fresh": b"x"}
    assert c.delete("k", noreply=False) is True
    assert c.delete("k", noreply=False) is False
    assert c.get("k") is None
    assert c.version()
    c.close()


def test_pymemcache_without_tls_is_refused_and_stores_nothing(pki, tls_daemon):
    plain = Memcache(tls_daemon.memcache, timeout=CLIENT_TIMEOUT_S)
    with pytest.raises((MemcacheUnexpectedCloseError, ConnectionError, OSError)):
        plain.set("planted", b"x", noreply=False)
    plain.close()
    c = Memcache(tls_daemon.memcache, tls_context=client_context(pki), timeout=CLIENT_TIMEOUT_S)
    assert c.get("planted") is None
    c.close()


def test_mutual_tls_with_pymemcache(pki):
    daemon = start_holdfast("--tls-cert", pki["cert"], "--tls-key", pki["key"],
                            "--tls-client-ca", pki["ca_pem"], base=BASE,
                            want=("memcache", "lockd", "dlock"))
    try:
        c = Memcache(daemon.memcache, tls_context=client_context(pki, with_cert=True),
                     timeout=CLIENT_TIMEOUT_S)
        assert c.set("k", b"v")
        assert c.get("k") == b"v"
        c.close()
        # Without a client certificate: the handshake (or, in TLS 1.3, the first read) fails.
        anon = Memcache(daemon.memcache, tls_context=client_context(pki), timeout=CLIENT_TIMEOUT_S)
        with pytest.raises((ssl.SSLError, MemcacheUnexpectedCloseError, ConnectionError, OSError)):
            anon.get("k")
        anon.close()
    finally:
        stop_holdfast(daemon.proc)


def test_dlock_protobuf_client_over_tls(pki, tls_daemon, tmp_path):
    with open(os.path.join(HERE, "dlock.proto")) as f:
        pb = compile_proto(f.read().replace("package dlock;", "package dlock_tls;"), str(tmp_path),
                           "dlock_tls")

    def call(sock, request):
        body = request.SerializeToString()
        sock.sendall(struct.pack(">I", len(body)) + body)
        (length,) = struct.unpack(">I", recv_exact(sock, 4))
        resp = pb.Response()
        resp.ParseFromString(recv_exact(sock, length))
        return resp

    addr = tls_daemon.addresses["dlock"]
    a, b = tls_socket(pki, addr), tls_socket(pki, addr)
    ping = call(a, pb.Request(id=1, type=pb.Ping))
    assert (ping.request_id, ping.status, ping.version) == (1, pb.Ok, 2)
    got = call(a, lock_request(pb, 2, ["x", "y"]))
    assert (got.request_id, got.status) == (2, pb.Ok)
    busy = lock_request(pb, 3, ["y"])
    busy.lock.wait_micro = 0
    refused = call(b, busy)
    assert (refused.request_id, refused.status, list(refused.keys)) == (3, pb.AcquireTimeout, ["y"])
    # The holder's TLS connection closes: its locks go.
    a.close()
    waiting = lock_request(pb, 4, ["y"])
    waiting.lock.wait_micro = 5_000_000
    granted = call(b, waiting)
    assert (granted.request_id, granted.status) == (4, pb.Ok)
    b.close()


def lockd_frame(opcode, payload):
    return struct.pack(">I", (1 << 28) | (opcode << 20) | len(payload)) + payload


def lockd_reply(sock):
    (word,) = struct.unpack(">I", recv_exact(sock, 4))
    assert word >> 28 == 1
    return (word >> 20) & 0xFF, recv_exact(sock, word & 0xFFFFF)


ACQ, REL, TRY, PING = 1, 2, 3, 4
ACQUIRED, WBLOCK, RELEASED, PONG, ACK = 128, 129, 130, 131, 132


def test_old_protocol_over_tls(pki, tls_daemon):
    addr = tls_daemon.addresses["lockd"]
    a, b = tls_socket(pki, addr), tls_socket(pki, addr)
    a.sendall(lockd_frame(PING, b"hello"))
    assert lockd_reply(a) == (PONG, b"hello")
    a.sendall(lockd_frame(ACQ, b"name\0"))
    assert lockd_reply(a) == (ACQUIRED, b"name\0")
    b.sendall(lockd_frame(TRY, b"name\0"))
    assert lockd_reply(b) == (WBLOCK, b"name\0")
    b.sendall(lockd_frame(ACQ, b"name\0"))
    assert lockd_reply(b) == (ACK, b"name\0")
    a.sendall(lockd_frame(REL, b"name\0"))
    assert lockd_reply(a) == (RELEASED, b"name\0")
    assert lockd_reply(b) == (ACQUIRED, b"name\0")
    a.close()
    b.close()


def s_client(port, ca_pem, *extra):
    return subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", ca_pem,
         "-verify_ip", "127.0.0.1", "-verify_return_error", "-brief", *extra],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=S_CLIENT_TIMEOUT_S)


@pytest.mark.skipif(shutil.which("openssl") is None,
                    reason="no openssl binary (make deps-apt installs it)")
@pytest.mark.parametrize("version", ["-tls1_3", "-tls1_2"])
def test_openssl_s_client_handshake(pki, tls_daemon, version):
    for proto in ("memcache", "lockd", "dlock"):
        port = tls_daemon.addresses[proto][1]
        r = s_client(port, pki["ca_pem"], version)
        out = r.stdout + r.stderr
        assert r.returncode == 0, f"{proto} {version}: {out}"
        assert "Verification: OK" in out, out
        assert ("TLSv1.3" if version == "-tls1_3" else "TLSv1.2") in out, out


@pytest.mark.skipif(shutil.which("openssl") is None,
                    reason="no openssl binary (make deps-apt installs it)")
def test_openssl_s_client_rejects_a_foreign_ca(tls_daemon, tmp_path):
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    r = s_client(tls_daemon.memcache[1], str(other))
    assert r.returncode != 0, r.stdout + r.stderr
