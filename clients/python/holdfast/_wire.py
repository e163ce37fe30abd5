"""Frames of the native protocol (dlock version 3): a 4-byte big-endian length, then a protobuf
Request or Response from proto/holdfast.proto (registered here as package `holdfast.v3`).

A request is written by hand around a cached body: the fixed head (version 3, the access token,
the type) is built once per client and type, the request id is a varint spliced in, and the
`lock` field's body (a RequestLock) is serialized by protobuf once per shape. Protobuf parsers
accept fields in any order, and every byte written here is what protobuf itself would write for
that field.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

from ._proto import holdfast_v3_pb2 as pb

PING = pb.Ping
LOCK = pb.Lock
UNLOCK = pb.Unlock
EXTEND = pb.Extend
WATCH = pb.Watch
UNWATCH = pb.Unwatch
GET = pb.Get
CHECK_FENCE = pb.CheckFence

OK = pb.Ok
ACQUIRE_TIMEOUT = pb.AcquireTimeout
NOT_HELD = pb.NotHeld
STALE_FENCE = pb.StaleFence

EVENT_KINDS = {pb.Acquired: "acquired", pb.Released: "released", pb.Expired: "expired",
               pb.Lost: "lost"}

VERSION = 3
# Field 2 (id, varint) and field 51 (lock, length-delimited): their tags as protobuf writes them.
_ID_TAG = b"\x10"
_LOCK_TAG = b"\x9a\x03"
# In RequestLock: release_micro (2, varint), keys (3, length-delimited), fence (104, varint).
_RELEASE_TAG = b"\x10"
_KEYS_TAG = b"\x1a"
_FENCE_TAG = b"\xc0\x06"
# Lock bodies kept per shape; the cache is emptied when it reaches this many.
_BODY_CACHE_MAX = 4096


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def micros(seconds: float, what: str) -> int:
    """Seconds as whole microseconds, rounded up (a lease or a wait is never shortened)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    if seconds < 0 or math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, not {seconds!r}")
    return int(math.ceil(seconds * 1_000_000))


def response(data: bytes) -> "pb.Response":
    return pb.Response.FromString(data)


class Encoder:
    """Requests of one client (one access token) as ready frames."""

    def __init__(self, token: Optional[str]):
        self._heads: Dict[int, bytes] = {}
        for t in (PING, LOCK, UNLOCK, EXTEND, WATCH, UNWATCH, GET, CHECK_FENCE):
            head = pb.Request(version=VERSION, type=t)
            if token is not None:
                head.access_token = token
            self._heads[t] = head.SerializeToString()
        self._bodies: Dict[Tuple, bytes] = {}

    def frame(self, type_: int, request_id: int, body: Optional[bytes]) -> bytes:
        msg = self._heads[type_] + _ID_TAG + varint(request_id)
        if body is not None:
            msg += _LOCK_TAG + varint(len(body)) + body
        return len(msg).to_bytes(4, "big") + msg

    def lock_body(self, key: str, wait_us: Optional[int], lease_us: Optional[int], shared: bool,
                  limit: Optional[int], value: Optional[bytes],
                  delay_us: Optional[int]) -> bytes:
        shape = (key, wait_us, lease_us, shared, limit, value, delay_us)
        body = self._bodies.get(shape)
        if body is None:
            m = pb.RequestLock(keys=[key])
            if wait_us is not None:
                m.wait_micro = wait_us
            if lease_us is not None:
                m.release_micro = lease_us
            if shared:
                m.shared = True
            if limit is not None:
                m.limit = limit
            if value is not None:
                m.value = value
            if delay_us is not None:
                m.lock_delay_micro = delay_us
            body = m.SerializeToString()
            if len(self._bodies) >= _BODY_CACHE_MAX:
                self._bodies.clear()
            self._bodies[shape] = body
        return body

    @staticmethod
    def body(key: str, *, fence: Optional[int] = None, release_us: Optional[int] = None) -> bytes:
        """A RequestLock naming one key, with a fence and a lease if given: written by hand
        (field 3, keys; 104, fence; 2, release_micro), as protobuf writes them."""
        k = key.encode()
        out = _KEYS_TAG + varint(len(k)) + k
        if release_us is not None:
            out = _RELEASE_TAG + varint(release_us) + out
        if fence is not None:
            out += _FENCE_TAG + varint(fence)
        return out
