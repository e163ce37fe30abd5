"""pymemcache (memcached text protocol) doing real client work against holdfast, plus yrmcds's
text lock commands sent raw through the same client's socket."""

import time

import pytest
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheClientError, MemcacheServerError, MemcacheUnknownError

from conftest import CLIENT_TIMEOUT_S


def client(holdfast, **kw):
    return Client(holdfast.memcache, connect_timeout=CLIENT_TIMEOUT_S, timeout=CLIENT_TIMEOUT_S, **kw)


def raw(c, line):
    """Send one text command through the pymemcache client's own socket; return its reply line.

    pymemcache reads each reply whole, so nothing of earlier commands is pending on the socket.
    """
    if c.sock is None:
        c._connect()
    c.sock.sendall(line)
    buf = b""
    while not buf.endswith(b"\r\n"):
        chunk = c.sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {buf!r}")
        buf += chunk
    return buf


def test_set_get_add_delete(holdfast):
    c = client(holdfast)
    assert c.set("k", b"v1", noreply=False) is True
    assert c.get("k") == b"v1"
    assert c.add("k", b"v2", noreply=False) is False
    assert c.add("new", b"n", noreply=False) is True
    assert c.get_many(["k", "new", "missing"]) == {"k": b"v1", "new": b"n"}
    assert c.delete("k", noreply=False) is True
    assert c.delete("k", noreply=False) is False
    assert c.get("k") is None
    assert c.version().startswith(b"1.6.0")


def test_incr_decr(holdfast):
    c = client(holdfast)
    c.set("n", b"41", noreply=False)
    assert c.incr("n", 1) == 42
    assert c.decr("n", 50) == 0
    assert c.incr("missing", 1) is None


def test_gets_and_cas(holdfast):
    c = client(holdfast)
    c.set("k", b"a", noreply=False)
    value, cas = c.gets("k")
    assert value == b"a"
    assert c.cas("k", b"b", cas, noreply=False) is True
    assert c.cas("k", b"c", cas, noreply=False) is False  # EXISTS
    assert c.get("k") == b"b"
    assert c.cas("missing", b"x", b"1", noreply=False) is None  # NOT_FOUND


def test_touch_and_expiry(holdfast):
    c = client(holdfast)
    c.set("k", b"v", expire=100, noreply=False)
    assert c.touch("k", expire=1, noreply=False) is True
    assert c.touch("missing", expire=1, noreply=False) is False
    deadline = time.monotonic() + 10
    while c.get("k") is not None:
        assert time.monotonic() < deadline, "touched item never expired"
        time.sleep(0.05)


def test_noreply_default_keeps_the_stream_in_sync(holdfast):
    # pymemcache sends noreply by default and never reads an answer: errors must be silent too.
    c = client(holdfast)
    for i in range(50):
        c.set(f"k{i}", str(i).encode())
    c.add("k0", b"dup")  # NOT_STORED, silent
    c.incr("k1", 5, noreply=True)
    c.delete("missing")  # NOT_FOUND, silent
    assert c.get_many([f"k{i}" for i in range(3)]) == {"k0": b"0", "k1": b"6", "k2": b"2"}


def test_a_locked_key_refuses_a_second_clients_set(holdfast):
    a, b = client(holdfast), client(holdfast)
    a.set("job", b"free", noreply=False)
    assert raw(a, b"lock job\r\n") == b"OK\r\n"
    assert raw(b, b"lock job\r\n") == b"LOCKED\r\n"
    # b may read but not write.
    assert b.get("job") == b"free"
    with pytest.raises(MemcacheUnknownError, match="LOCKED"):
        b.set("job", b"stolen", noreply=False)
    assert b.delete("job", noreply=False) is False  # pymemcache: "not DELETED"
    assert raw(b, b"delete job\r\n") == b"LOCKED\r\n"
    assert raw(b, b"incr job 1\r\n") == b"LOCKED\r\n"
    b.set("job", b"stolen")  # noreply: silently refused
    assert b.get("job") == b"free"
    # The holder writes, then releases; b may then lock and write.
    assert a.set("job", b"done", noreply=False) is True
    assert raw(a, b"unlock job\r\n") == b"OK\r\n"
    assert raw(b, b"unlock job\r\n") == b"CLIENT_ERROR object is not locked or not found\r\n"
    assert raw(b, b"lock job\r\n") == b"OK\r\n"
    assert b.set("job", b"b's", noreply=False) is True
    assert a.get("job") == b"b's"


def test_closing_the_holder_releases_its_locks(holdfast):
    a, b = client(holdfast), client(holdfast)
    for k in ("x", "y"):
        a.set(k, b"v", noreply=False)
        assert raw(a, f"lock {k}\r\n".encode()) == b"OK\r\n"
    a.close()
    deadline = time.monotonic() + 10
    while raw(b, b"lock x\r\n") != b"OK\r\n":
        assert time.monotonic() < deadline, "disconnect did not release the lock"
        time.sleep(0.05)
    assert raw(b, b"lock y\r\n") == b"OK\r\n"
    assert raw(b, b"unlock_all\r\n") == b"OK\r\n"


def test_errors_surface_as_pymemcache_exceptions(holdfast):
    c = client(holdfast)
    c.set("word", b"abc", noreply=False)
    with pytest.raises(MemcacheClientError):
        c.incr("word", 1)
    big = client(holdfast)
    with pytest.raises(MemcacheServerError, match="too large"):
        big.set("big", b"x" * (2 * 1024 * 1024), noreply=False)
    # The connection is still in sync after the refused value.
    assert big.set("small", b"s", noreply=False) is True
    assert big.get("small") == b"s"
