#!/usr/bin/env python3
"""Write the small seed corpus of every fuzz target into fuzz/corpus/<target>/ (valid requests of
each kind, a few pipelines and edge cases). Deterministic: rerun after changing it and commit."""
import hashlib
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for old in os.listdir(d):
        os.remove(os.path.join(d, old))
    for name, data in seeds:
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


# memcached text: first byte = chunk size (low 6 bits) | small item limit (0x40).
TEXT = {
    "get": b"get a\r\n",
    "gets_multi": b"gets a b  c\r\n",
    "gat": b"gat 10 a b\r\n",
    "set": b"set a 5 0 3\r\nabc\r\n",
    "set_noreply": b"set a 0 0 1 noreply\r\nx\r\n",
    "add": b"add k 0 100 2\r\nhi\r\n",
    "cas": b"cas k 0 0 1 42\r\nx\r\n",
    "append": b"append k 0 0 1\r\nx\r\nprepend k 0 0 1\r\ny\r\n",
    "delete": b"delete a\r\ndelete a 0 noreply\r\n",
    "incr": b"incr n 5\r\ndecr n 2 noreply\r\n",
    "touch": b"touch a -1\r\n",
    "flush": b"flush_all\r\nflush_all 10 noreply\r\n",
    "stats": b"stats\r\nstats settings\r\n",
    "version": b"version\nverbosity 1\r\nquit\r\n",
    "lock": b"lock a\r\nunlock a\r\nunlock_all\r\n",
    "lock_token": b"lock a\r\nlock_token a\r\nlock_token\r\nlock_token b c\r\n",
    "bad": b"bogus\r\nset a b c d\r\nget\r\n\r\n",
    "too_large": b"set a 0 0 2000\r\n" + b"x" * 2000 + b"\r\nget a\r\n",
    "bad_chunk": b"set a 0 0 1\r\nxyz\r\nget a\r\n",
    "partial": b"set a 0 0 10\r\nabc",
    "keys": b"keys\r\nkeys pre\r\nkeys a b\r\n",
}
write("memcache_text", [(n, bytes([0x03 if i % 2 else 0x7f]) + v) for i, (n, v) in enumerate(TEXT.items())])


def bin_req(op, key=b"", extras=b"", value=b"", opaque=1, cas=0):
    body = len(extras) + len(key) + len(value)
    return (bytes([0x80, op]) + struct.pack(">HBBHIIQ", len(key), len(extras), 0, 0, body, opaque, cas)
            + extras + key + value)


SET_EXTRAS = struct.pack(">II", 0, 0)
BIN = {
    "get": bin_req(0x00, b"a"),
    "set": bin_req(0x01, b"a", SET_EXTRAS, b"value"),
    "setq_getk": bin_req(0x11, b"a", SET_EXTRAS, b"v") + bin_req(0x0C, b"a"),
    "delete": bin_req(0x04, b"a"),
    "incr": bin_req(0x05, b"n", struct.pack(">QQI", 1, 0, 0)),
    "noop_version": bin_req(0x0A) + bin_req(0x0B),
    "touch": bin_req(0x1C, b"a", struct.pack(">I", 10)),
    "gat": bin_req(0x1D, b"a", struct.pack(">I", 10)),
    "lock_unlock": bin_req(0x40, b"a") + bin_req(0x42, b"a") + bin_req(0x44),
    "lag": bin_req(0x46, b"a") + bin_req(0x48, b"a", struct.pack(">I", 5)),
    "rau": bin_req(0x4A, b"a", SET_EXTRAS, b"new", cas=3),
    "long_key": bin_req(0x00, b"k" * 251),
    "big_value": bin_req(0x01, b"a", SET_EXTRAS, b"x" * 40),
    "partial": bin_req(0x01, b"a", SET_EXTRAS, b"value")[:30],
}
write("memcache_binary", [(n, bytes([i % 2]) + v) for i, (n, v) in enumerate(BIN.items())])


def ld(op, payload, version=1):
    return struct.pack(">I", version << 28 | op << 20 | len(payload)) + payload


LOCKD = {
    "acq": ld(1, b"a\0"),
    "try": ld(3, b"a\0"),
    "rel": ld(2, b"a\0"),
    "ping": ld(4, b"anything"),
    "adopt": ld(5, b"a\0"),
    "sync": ld(6, b""),
    "req_token": ld(1, b"a\0") + ld(7, b"a\0") + ld(7, b"b\0") + ld(7, b""),
    "pipeline": ld(1, b"a\0") + ld(1, b"b\0") + ld(2, b"a\0") + ld(6, b""),
    "no_nul": ld(1, b"abc"),
    "empty": ld(1, b""),
    "bad_op": ld(9, b"a\0"),
    "bad_version": ld(1, b"a\0", version=2),
    "partial": ld(1, b"abcdef\0")[:6],
}
write("lockd", list(LOCKD.items()))


def varint(v):
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7F | 0x80])
        v >>= 7
    return out + bytes([v])


def vfield(n, v):
    return varint(n << 3) + varint(v)


def bfield(n, b):
    return varint(n << 3 | 2) + varint(len(b)) + b


def dl_req(typ, id=1, keys=(), wait=None, lease=None, version=2, token=None):
    body = vfield(1, version) + vfield(2, id)
    if token is not None:
        body += bfield(3, token)
    body += vfield(4, typ)
    if typ in (2, 3):
        lock = b""
        if wait is not None:
            lock += vfield(1, wait)
        if lease is not None:
            lock += vfield(2, lease)
        for k in keys:
            lock += bfield(3, k)
        body += bfield(51, lock)
    return struct.pack(">I", len(body)) + body


DLOCK = {
    "ping": dl_req(1),
    "lock": dl_req(2, keys=[b"a"]),
    "lock_wait": dl_req(2, keys=[b"a", b"b"], wait=5000),
    "lock_try": dl_req(2, keys=[b"a"], wait=0),
    "lease": dl_req(2, keys=[b"a"], lease=1000000),
    "unlock": dl_req(3, keys=[b"a", b"b"]),
    "token": dl_req(2, keys=[b"a"], token=b"secret"),
    "version1": dl_req(1, version=1),
    "unknown_type": dl_req(9),
    "unknown_field": struct.pack(">I", 4) + vfield(1, 2) + vfield(7, 1),
    "garbage": struct.pack(">I", 3) + b"\xff\xff\xff",
    "pipeline": dl_req(2, 1, [b"a"]) + dl_req(3, 2, [b"a"]) + dl_req(1, 3),
    "partial": dl_req(2, keys=[b"abc"])[:9],
}
write("dlock", [(n, bytes([i % 2]) + v) for i, (n, v) in enumerate(DLOCK.items())])

# connection scripts: 3 config bytes (orphan timeout ms, idle, limits), then steps. A step's
# first byte: low 3 bits the kind, the rest the slot (slot % 3: 0 memcache, 1 lockd, 2 dlock).
#   0 raw bytes (len, bytes) · 1-3 request · 4 split request · 5 disconnect · 6 advance · 7 pipeline
def step(kind, slot, *rest):
    return bytes([slot << 3 | kind]) + bytes(rest)


def raw(slot, data):
    return step(0, slot) + bytes([len(data)]) + data


CONFIG = bytes([20, 0x21, 0x13])
CONN = {
    # memcache: set then lock on slot 0, slot 3 tries to lock, slot 0 disconnects, slot 3 locks.
    "mc_lock_handoff": CONFIG + step(1, 0, 0, 0, 1) + step(1, 0, 3, 0) + step(1, 3, 3, 0)
    + step(5, 0) + step(1, 3, 3, 0),
    "mc_raw": CONFIG + raw(0, b"set a 0 0 1\r\nv\r\nlock a\r\n") + raw(3, b"unlock a\r\n")
    + raw(0, b"unlock_all\r\nquit\r\n"),
    "mc_binary": CONFIG + step(1, 0, 0, 0, 4) + step(1, 0, 11, 0, 0) + step(1, 3, 11, 0, 2)
    + step(1, 0, 11, 0, 3),
    "mc_memory": CONFIG + b"".join(step(1, 0, 0, k % 3, 250) for k in range(12)) + step(1, 0, 3, 1),
    # lockd: acquire, queue, orphan, adopt, expire.
    "lockd_queue": CONFIG + step(1, 1, 0, 0) + step(1, 4, 0, 0) + step(5, 1) + step(6, 0, 30),
    "lockd_adopt": CONFIG + step(1, 1, 0, 1) + step(5, 1) + step(1, 4, 4, 1) + step(1, 4, 5, 0),
    "lockd_try_rel": CONFIG + step(1, 1, 2, 2) + step(1, 4, 2, 2) + step(1, 4, 3, 2)
    + step(1, 1, 6, 0),
    "lockd_raw": CONFIG + raw(1, ld(1, b"x\0") + ld(6, b"")) + raw(4, ld(1, b"x\0", version=3)),
    # dlock: lock, wait with deadline, lease, unlock, idle.
    "dlock_wait": CONFIG + step(1, 2, 1, 0, 0, 0, 0) + step(1, 5, 1, 0, 0, 0xF2, 0)
    + step(6, 0, 0x82) + step(1, 2, 8 | 0, 0, 0, 0, 0),
    "dlock_lease": CONFIG + step(1, 2, 0, 0, 0, 0x21) + step(5, 2) + step(1, 5, 0, 0, 0, 0, 0)
    + step(6, 0, 50),
    "dlock_idle": bytes([0, 0x09, 0]) + step(1, 2, 0, 1, 0, 0) + step(6, 0, 0xA0),
    "dlock_raw": CONFIG + raw(2, dl_req(2, keys=[b"a"])) + raw(5, b"\0\0\0\x02\xff\xff"),
    "mixed": CONFIG + step(7, 0, 1, 0, 0, 1, 3, 0) + step(7, 1, 0, 0, 0, 5, 0)
    + step(4, 2, 0, 0, 0, 0, 7) + step(6, 0, 0xFF) + step(5, 0) + step(5, 1),
}
write("connection", list(CONN.items()))


# command entries (server::command): "HFc2", now, op count, then per op worker/slot/gen, a tag
# and its fields (varints; byte strings length-prefixed; an option is a 0 byte, or a 1 byte and
# the value; a memcached command's form follows its tag: 0 text, 1 text noreply, 2 binary with
# opcode and opaque).
def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def vbytes(b):
    return varint(len(b)) + b


def op(slot, tag, fields=b""):
    return varint(0) + varint(slot) + varint(1) + bytes([tag]) + fields


def entry(now, ops):
    return b"HFc2" + varint(now) + varint(len(ops)) + b"".join(ops)


COMMAND = {
    "empty_turn": entry(1_700_000_000_000, []),
    "mc_set_lock": entry(1_700_000_000_000, [
        op(1, 2, b"\1" + bytes([0]) + vbytes(b"k") + varint(0) + varint(0) + vbytes(b"v")
           + b"\0"),
        op(1, 8, b"\0" + vbytes(b"k")),
        op(2, 9, b"\0" + vbytes(b"k")),
        op(1, 42),
    ]),
    "lockd_acq_queue": entry(5, [op(1, 20, bytes([1]) + vbytes(b"n\0")),
                                 op(2, 20, bytes([1]) + vbytes(b"n\0")), op(1, 42)]),
    "dlock_lock_wait": entry(9, [op(1, 41), op(2, 41),
                                 op(1, 31, b"\1" + varint(1) + vbytes(b"\x1a\x01a") + varint(1)
                                    + b"\0" + b"\0"),
                                 op(2, 31, b"\1" + varint(2) + vbytes(b"\x1a\x01a") + varint(1)
                                    + b"\1" + varint(5000) + b"\0")]),
    "binary_lock": entry(3, [op(1, 8, b"\2" + bytes([0x40]) + varint(7) + vbytes(b"k"))]),
    # counter Acquire 1 of 2, Dump, Release 1, then a close (tags 51, 54, 52, 42)
    "counter_acquire_dump": entry(7, [op(1, 51, varint(9) + varint(1) + varint(2) + vbytes(b"sem")),
                                      op(2, 54, varint(3)),
                                      op(1, 52, varint(4) + varint(1) + vbytes(b"sem")),
                                      op(1, 42)]),
}
write("command", list(COMMAND.items()))


# yrmcds counter protocol (docs/counter.md): magic 0x90, opcode, flags, reserved, length, opaque.
def ct(op, body=b"", opaque=1, magic=0x90, length=None):
    n = len(body) if length is None else length
    return struct.pack(">BBBBII", magic, op, 0, 0, n, opaque) + body


def ct_name(name):
    return struct.pack(">H", len(name)) + name


COUNTER = {
    "noop": ct(0x00),
    "get": ct(0x01, ct_name(b"sem")),
    "acquire": ct(0x02, struct.pack(">II", 2, 5) + ct_name(b"sem")),
    "release": ct(0x03, struct.pack(">I", 2) + ct_name(b"sem")),
    "stats_dump": ct(0x10) + ct(0x11),
    "pipeline": ct(0x02, struct.pack(">II", 1, 1) + ct_name(b"a")) + ct(0x01, ct_name(b"a")) + ct(0x00),
    "invalid": ct(0x02, struct.pack(">II", 0, 1) + ct_name(b"a")) + ct(0x01, b"\x00\x05ab"),
    "unknown": ct(0x42, b"xyz"),
    "bad_magic": ct(0x00) + b"get a\r\n",
    "too_large": ct(0x01, b"", length=0x7FFFFFFF),
}
write("counter", list(COUNTER.items()))


# TLS boundary: protocol byte (0 memcache, 1 lockd, 2 dlock, 3 counter), mode byte (0 raw bytes,
# 1 a real ClientHello then raw bytes, 2 a real client's session with the payload as its
# requests, +4 with its close_notify after them, 3 the same with one byte flipped), two bytes
# seeding the read splits, then the payload (fuzz/src/tls.rs).
def tls(proto, mode, seed, payload):
    return bytes([proto, mode]) + struct.pack("<H", seed) + payload


TLS = {
    "plaintext": tls(0, 0, 1, b"get a\r\n"),
    "record_header": tls(0, 0, 2, b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"),
    "oversized_record": tls(0, 0, 3, b"\x16\x03\x01\xff\xff" + b"\x00" * 64),
    "hello_then_data": tls(2, 1, 4, b"\x17\x03\x03\x00\x10" + b"\x00" * 16),
    "hello_then_alert": tls(1, 1, 5, b"\x15\x03\x03\x00\x02\x01\x00"),
    "memcache": tls(0, 2, 6, b"set a 0 0 1\r\nx\r\nget a\r\nversion\r\nlock a\r\n"),
    "memcache_close_notify": tls(0, 6, 7, b"get a\r\nget b\r\n"),
    "memcache_binary": tls(0, 2, 8, bin_req(0x0a) + bin_req(0x00, b"k")),
    "lockd": tls(1, 2, 9, ld(1, b"a\0") + ld(4, b"ping") + ld(2, b"a\0")),
    "lockd_close_notify": tls(1, 6, 10, ld(1, b"a\0") + ld(6, b"")),
    "dlock": tls(2, 2, 11, dl_req(1) + dl_req(2, keys=[b"k"], wait=0)),
    "dlock_close_notify": tls(2, 6, 12, dl_req(2, keys=[b"k"])),
    "counter": tls(3, 2, 13, ct(0x02, struct.pack(">II", 1, 1) + ct_name(b"a")) + ct(0x00)),
    "flipped": tls(0, 3, 14, b"get a\r\n"),
    "flipped_late": tls(2, 3, 900, dl_req(1) * 8),
}
write("tls_boundary", list(TLS.items()))
