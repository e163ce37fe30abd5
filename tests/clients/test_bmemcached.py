"""python-binary-memcached (memcached binary protocol) doing real client work against holdfast,
plus yrmcds's binary lock opcodes (0x40-0x4b) sent raw through the same client's socket."""

import struct
import time

import bmemcached
import pytest
from bmemcached.exceptions import MemcachedException

from conftest import CLIENT_TIMEOUT_S

HEADER = "!BBHBBHLLQ"
LOCK, UNLOCK, UNLOCK_ALL, LAG, RAU = 0x40, 0x42, 0x44, 0x46, 0x4A
STATUS_LOCKED, STATUS_NOT_LOCKED = 0x0010, 0x0011
AUTH_ERROR = 0x0020


def client(holdfast):
    return bmemcached.Client((holdfast.memcache_server,), socket_timeout=CLIENT_TIMEOUT_S)


def protocol(c):
    (server,) = c._servers
    server._open_connection()
    return server


def binary(c, opcode, key=b"", extras=b"", value=b""):
    """Send one binary request through the client's own connection; return (status, extras,
    value) of its response."""
    server = protocol(c)
    body = len(extras) + len(key) + len(value)
    server._send(struct.pack(HEADER, 0x80, opcode, len(key), len(extras), 0, 0, body, 0, 0) + extras + key + value)
    (_magic, op, keylen, extlen, _dt, status, bodylen, _opaque, _cas, content) = server._get_response()
    assert op == opcode
    content = content or b""
    return status, content[:extlen], content[extlen + keylen :]


def text(c, line):
    """A text command on the binary client's socket: holdfast tells them apart per request."""
    server = protocol(c)
    server.connection.sendall(line)
    buf = b""
    while not buf.endswith(b"\r\n"):
        buf += server.connection.recv(4096)
    return buf


def test_set_get_add_delete_get_multi(holdfast):
    c = client(holdfast)
    assert c.set("k", "v1") is True
    assert c.get("k") == "v1"
    assert c.add("k", "v2") is False
    assert c.add("n", "nn") is True
    assert c.replace("n", "n2") is True
    # get_multi is GetKQ... + NOOP: hits answered, misses silent.
    assert c.get_multi(["k", "n", "missing"]) == {"k": "v1", "n": "n2"}
    assert c.delete("k") is True
    assert c.get("k") is None
    # bmemcached's delete answers True for "not found" too (only "exists" is False).
    assert c.delete("k", cas=1) is True
    c.set("k", "again")
    assert c.delete("k", cas=1) is False  # CAS mismatch: 0x0002
    assert c.get("k") == "again"


def test_incr_decr_and_cas(holdfast):
    c = client(holdfast)
    c.set("n", 10)
    assert c.incr("n", 5) == 15
    assert c.decr("n", 20) == 0
    value, cas = c.gets("n")
    assert value == 0 and cas
    assert c.cas("n", 7, cas) is True
    assert c.cas("n", 8, cas) is False
    assert c.get("n") == 7


def test_a_locked_key_refuses_a_second_clients_set(holdfast):
    a, b = client(holdfast), client(holdfast)
    a.set("job", "free")
    assert binary(a, LOCK, b"job")[0] == 0
    assert binary(b, LOCK, b"job")[0] == STATUS_LOCKED
    assert b.get("job") == "free"
    with pytest.raises(MemcachedException) as refused:
        b.set("job", "stolen")
    assert refused.value.code == STATUS_LOCKED
    with pytest.raises(MemcachedException) as refused:
        b.incr("job", 1)
    assert refused.value.code == STATUS_LOCKED
    assert b.get("job") == "free"
    # Unlock errors: not held by b.
    assert binary(b, UNLOCK, b"job")[0] == STATUS_NOT_LOCKED
    # The holder replaces and unlocks in one step (RaU, flags 0).
    status, _, _ = binary(a, RAU, b"job", extras=struct.pack("!LL", 0, 0), value=b"done")
    assert status == 0
    assert b.get("job") == "done"
    assert b.set("job", "b's") is True


def test_lock_and_get_then_text_unlock_on_the_same_socket(holdfast):
    a, b = client(holdfast), client(holdfast)
    a.set("k", "v")
    status, extras, value = binary(a, LAG, b"k")
    assert (status, len(extras), value) == (0, 4, b"v")
    assert text(b, b"lock k\r\n") == b"LOCKED\r\n"
    assert text(a, b"unlock k\r\n") == b"OK\r\n"
    assert text(b, b"lock k\r\n") == b"OK\r\n"
    assert binary(b, UNLOCK_ALL)[0] == 0
    assert b.set("k", "free again") is True


def test_disconnect_releases_the_locks(holdfast):
    a, b = client(holdfast), client(holdfast)
    a.set("k", "v")
    assert binary(a, LOCK, b"k")[0] == 0
    a.disconnect_all()
    deadline = time.monotonic() + 10
    while binary(b, LOCK, b"k")[0] != 0:
        assert time.monotonic() < deadline, "disconnect did not release the lock"
        time.sleep(0.05)
    assert b.set("k", "mine") is True


@pytest.fixture
def holdfast_with_users(tmp_path):
    """A daemon whose memcached clients must authenticate (--memcache-auth-file, mode 0600)."""
    from conftest import start_holdfast, stop_holdfast

    users = tmp_path / "users"
    users.write_text("alice:wonder land\nbob:hunter2\n")
    users.chmod(0o600)
    daemon = start_holdfast("--memcache-auth-file", str(users))
    yield daemon
    stop_holdfast(daemon.proc)
    assert daemon.proc.returncode == 0, f"holdfast exited with {daemon.proc.returncode} on SIGTERM"


def authed(holdfast, user, password):
    return bmemcached.Client(
        (holdfast.memcache_server,), user, password, socket_timeout=CLIENT_TIMEOUT_S
    )


def test_sasl_plain_authenticates_and_the_client_works(holdfast_with_users):
    c = authed(holdfast_with_users, "alice", "wonder land")
    assert c.set("k", "v1") is True
    assert c.get("k") == "v1"
    assert c.get_multi(["k", "missing"]) == {"k": "v1"}
    assert binary(c, LOCK, b"k")[0] == 0
    d = authed(holdfast_with_users, "bob", "hunter2")
    assert binary(d, LOCK, b"k")[0] == STATUS_LOCKED
    assert c.delete("k") is True


def test_a_wrong_password_is_refused_and_nothing_is_stored(holdfast_with_users):
    # python-binary-memcached takes 0x08 for the auth error status: memcached's (and holdfast's)
    # 0x0020 reaches the caller as a MemcachedException with that code and "Auth failure.".
    for user, password in [("alice", "wonderland"), ("mallory", "hunter2"), ("bob", "hunter2 ")]:
        bad = authed(holdfast_with_users, user, password)
        with pytest.raises(MemcachedException) as refused:
            bad.set("k", f"from {user}")
        assert refused.value.code == AUTH_ERROR, refused.value.message
        assert "Auth failure." in refused.value.message
    # Without credentials the client does not authenticate: its request is an auth error.
    anonymous = bmemcached.Client((holdfast_with_users.memcache_server,), socket_timeout=CLIENT_TIMEOUT_S)
    with pytest.raises(MemcachedException) as refused:
        anonymous.set("k", "anonymous")
    assert refused.value.code == AUTH_ERROR
    good = authed(holdfast_with_users, "bob", "hunter2")
    assert good.get("k") is None
