"""The client: one connection at a time to one of the servers, shared by every thread.

Threads:
- the callers' own threads send requests and wait for their answers;
- one reader thread per connection (see _conn.py) completes those waits, feeds watches and
  marks holds lost when a loss notice comes;
- one keeper thread per client renews leases at a third of their length (Extend by fence),
  re-attaches them after a reconnect (Extend by fence on the next server), sets `lost` before a
  lease it could not renew ends, and sends Ping on an idle connection.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

from . import _wire
from ._conn import Call, Connection
from ._proto import holdfast_v3_pb2 as pb

log = logging.getLogger("holdfast")

# A Lock answered later than this after it was sent waited for its grant.
_WAITED_S = 0.05

__all__ = ["Client", "Hold", "KeyInfo", "Holder", "Event", "Watch", "Error", "AcquireTimeout",
           "ConnectionLost", "RequestError"]


# Errors.

class Error(Exception):
    """Every error this library raises."""


class AcquireTimeout(Error):
    """A lock's `wait` ran out before it was granted."""

    def __init__(self, name: str, wait: Optional[float]):
        super().__init__(f"{name!r} not acquired within {wait} s")
        self.name = name
        self.wait = wait


class ConnectionLost(Error, ConnectionError):
    """No server could be reached, or the connection broke under a request that cannot be
    repeated safely (or under a watch: events may have been missed)."""


class RequestError(Error):
    """The server refused a request: `status` is the protocol's status name (InvalidArgument,
    General, ...), `text` its error_text, `keys` the keys it named."""

    def __init__(self, status: str, text: str, keys: Sequence[str] = ()):
        super().__init__(f"{status}: {text}" if text else status)
        self.status = status
        self.text = text
        self.keys = tuple(keys)


def _refused(resp) -> RequestError:
    try:
        name = pb.ResponseStatus.Name(resp.status)
    except ValueError:
        name = f"status {resp.status}"
    return RequestError(name, resp.error_text, list(resp.keys))


# What the server shows.

@dataclass(frozen=True)
class Holder:
    """One grant of a key: its fencing token, its value, the seconds left of its lease (None:
    held while its holder's connection lives) and, in cluster mode, the holder's node."""

    fence: int
    value: bytes
    lease_left: Optional[float]
    node: Optional[int]


@dataclass(frozen=True)
class KeyInfo:
    """A key's state: its holders in grant order, the requests waiting for it, its mode and
    limit, and the lock-delay left (seconds)."""

    key: str
    holders: Tuple[Holder, ...]
    waiters: int
    shared: bool
    limit: int
    delayed: float

    @classmethod
    def _from(cls, info) -> "KeyInfo":
        holders = tuple(Holder(h.fence, h.value,
                               h.lease_left_micro / 1e6 if h.lease_left_micro else None,
                               h.node if h.HasField("node") and h.node else None)
                        for h in info.holders)
        return cls(info.key, holders, info.waiters, info.shared, info.limit or 1,
                   info.delayed_micro / 1e6)


@dataclass(frozen=True)
class Event:
    """A change of a watched key: kind is "acquired", "released", "expired" or "lost"; fence and
    value are those of the grant that began or ended."""

    key: str
    kind: str
    fence: int
    value: bytes


# A hold.

class Hold:
    """One grant, as returned by `Client.lock()`; a context manager that releases it on exit.

    `fence` is the grant's fencing token; `lost` is set when the grant is gone without this
    hold having released it (its lease could not be renewed in time, another client unlocked it
    by fence, the connection of a connection-bound hold broke, the client was closed)."""

    def __init__(self, client: "Client", name: str, fence: int, lease: Optional[float],
                 conn: Connection, request_id: int, sent_at: float):
        self.name = name
        self.fence = fence
        self.lease = lease
        self.lost = threading.Event()
        self.lost_reason: Optional[str] = None
        self._client = client
        self._conn = conn
        self._ids: List[int] = [request_id]
        self._released = False
        self._renewing = False
        self._extend_call: Optional[Call] = None
        # Not before this may a refused Extend be sent again.
        self._retry_at = 0.0
        self.expires = self.renew_at = self.lost_at = float("inf")
        if lease is not None:
            self._renewed(sent_at)

    def _renewed(self, sent_at: float) -> None:
        lease = self.lease
        self.expires = sent_at + lease
        self.renew_at = sent_at + lease / 3
        # `lost` is set this long before the lease's end as this client counts it (from when
        # it sent the last Lock or Extend; the server counts from when it got it).
        self.lost_at = self.expires - min(max(lease * 0.1, 0.05), 1.0)

    @property
    def held(self) -> bool:
        return not self._released and not self.lost.is_set()

    def release(self) -> None:
        """Unlock this grant (by its fence). Returns once the server confirmed it or the
        connection is gone; releasing twice, or after a loss, is fine."""
        self._client._release(self)

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        if self._released:
            state = "released"
        elif self.lost.is_set():
            state = f"lost ({self.lost_reason})"
        else:
            state = "held"
        lease = "connection-bound" if self.lease is None else f"lease {self.lease} s"
        return f"<holdfast.Hold {self.name!r} fence={self.fence} {lease} {state}>"


# A watch.

_CLOSED = object()


class Watch:
    """The events of one key, from `Client.watch()`: iterate it (it blocks for the next event),
    or call `next(timeout)`. `info` is the key's state when the watch began. Iteration ends
    after `close()`; a broken connection raises ConnectionLost (events may have been missed:
    watch again, and read `info`)."""

    def __init__(self, client: "Client", name: str):
        self.name = name
        self.info: Optional[KeyInfo] = None
        self._client = client
        self._queue: "queue.Queue" = queue.Queue()
        self._closed = False

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> Event:
        ev = self.next(None)
        assert ev is not None
        return ev

    def next(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event; None if none came within `timeout` seconds."""
        if self._closed and self._queue.empty():
            raise StopIteration
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _CLOSED:
            self._closed = True
            raise StopIteration
        if isinstance(item, Exception):
            self._closed = True
            raise item
        return item

    def close(self) -> None:
        if not self._closed:
            self._client._unwatch(self)
            self._queue.put(_CLOSED)

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<holdfast.Watch {self.name!r}{' closed' if self._closed else ''}>"


class _Subscription:
    """The server's watch of one key on one connection, shared by the client's Watch objects."""

    __slots__ = ("key", "request_id", "conn", "watchers")

    def __init__(self, key: str, request_id: int, conn: Connection):
        self.key, self.request_id, self.conn = key, request_id, conn
        self.watchers: Set[Watch] = set()


# The client.

def _address(server: Union[str, Tuple[str, int]]) -> Tuple[str, int]:
    if isinstance(server, tuple):
        return server[0], int(server[1])
    host, sep, port = server.rpartition(":")
    if not sep or not host:
        raise ValueError(f"server {server!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


class Client:
    """A client of one holdfast node or cluster, safe to share between threads.

    servers: "HOST:PORT" strings (the dlock listener) or (host, port) tuples; on a lost
    connection the client moves on to the next one. token: the access token (--dlock-token).
    ssl_context: an ssl.SSLContext to speak TLS (the server's name checked against the host
    given here).
    """

    # Seconds; class attributes so that one program may tune them for all its clients.
    connect_timeout = 5.0
    # An answer slower than this (other than a waiting Lock's) breaks the connection.
    request_timeout = 10.0
    # A Ping after this long without a request (the server's idle timeout is 60 s).
    ping_interval = 15.0
    # Between two rounds over the servers while none answers.
    reconnect_delay = 0.1

    def __init__(self, servers: Union[str, Sequence[Union[str, Tuple[str, int]]]],
                 token: Optional[str] = None, ssl_context: Optional[ssl.SSLContext] = None):
        if isinstance(servers, (str, tuple)):
            servers = [servers]
        self._servers = [_address(s) for s in servers]
        if not self._servers:
            raise ValueError("no servers")
        self._ssl = ssl_context
        self._enc = _wire.Encoder(token)
        self._ids = itertools.count(1)
        self._mu = threading.RLock()
        self._connect_mu = threading.Lock()
        self._watch_mu = threading.Lock()
        self._wake = threading.Condition(self._mu)
        self._conn: Optional[Connection] = None
        self._next_server = 0
        self._holds: Set[Hold] = set()
        self._notices: Dict[int, Hold] = {}
        self._subs: Dict[str, _Subscription] = {}
        self._sub_ids: Dict[int, _Subscription] = {}
        self._ping_call: Optional[Call] = None
        # When the keeper wakes next by itself (0: it is awake).
        self._keeper_wakes = 0.0
        self._closed = False
        self._keeper = threading.Thread(target=self._keep, daemon=True, name="holdfast-keeper")
        self._keeper.start()

    def __repr__(self) -> str:
        servers = ",".join(f"{h}:{p}" for h, p in self._servers)
        conn = self._conn
        at = f" connected to {conn.label}" if conn is not None and conn.alive else ""
        state = " closed" if self._closed else ""
        return f"<holdfast.Client [{servers}]{at}{state}, {len(self._holds)} holds>"

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Connections.

    def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and conn.alive:
            return conn
        with self._connect_mu:
            conn = self._conn
            if conn is not None and conn.alive:
                return conn
            if self._closed:
                raise Error("the client is closed")
            errors = []
            n = len(self._servers)
            for i in range(n):
                idx = (self._next_server + i) % n
                address = self._servers[idx]
                try:
                    sock = socket.create_connection(address, timeout=self.connect_timeout)
                    try:
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                        if self._ssl is not None:
                            sock = self._ssl.wrap_socket(sock, server_hostname=address[0])
                        sock.settimeout(None)
                    except BaseException:
                        sock.close()
                        raise
                except OSError as e:
                    errors.append(f"{address[0]}:{address[1]}: {e}")
                    continue
                # The next connection, after this one breaks, tries the next server first.
                self._next_server = (idx + 1) % n
                conn = Connection(address, sock, self._ssl is not None, self._on_event,
                                  self._on_closed)
                with self._mu:
                    self._conn = conn
                conn.start()
                log.debug("holdfast: connected to %s", conn.label)
                with self._mu:
                    self._wake.notify_all()
                return conn
            raise ConnectionLost("no server answered: " + "; ".join(errors))

    def _on_closed(self, conn: Connection, reason: str) -> None:
        if not self._closed:
            log.warning("holdfast: connection to %s lost: %s", conn.label, reason)
        with self._mu:
            if self._conn is conn:
                self._conn = None
            for hold in list(self._holds):
                if hold._conn is conn and hold.lease is None:
                    self._lose(hold, "the connection of a connection-bound hold broke")
            for key, sub in list(self._subs.items()):
                if sub.conn is conn:
                    del self._subs[key]
                    self._sub_ids.pop(sub.request_id, None)
                    for w in sub.watchers:
                        w._queue.put(ConnectionLost(f"watch of {key!r}: connection to "
                                                    f"{conn.label} lost: {reason}"))
            self._wake.notify_all()

    def _on_event(self, conn: Connection, resp) -> None:
        e = resp.event
        rid = resp.request_id
        with self._mu:
            sub = self._sub_ids.get(rid)
            if sub is not None and sub.conn is conn:
                ev = Event(e.key, _wire.EVENT_KINDS.get(e.kind, str(e.kind)), e.fence, e.value)
                for w in sub.watchers:
                    w._queue.put(ev)
                return
            hold = self._notices.get(rid)
            if hold is not None and hold.fence == e.fence:
                kind = "expired" if e.kind == pb.Expired else "lost"
                self._lose(hold, f"the server says {kind}")
                return
        log.debug("holdfast: %s: an event for no watch or hold (id %d)", conn.label, rid)

    def _lose(self, hold: Hold, reason: str) -> None:
        """With self._mu held."""
        if hold._released or hold.lost.is_set():
            return
        hold.lost_reason = reason
        hold.lost.set()
        log.warning("holdfast: lock %r (fence %d) lost: %s", hold.name, hold.fence, reason)
        self._forget(hold)

    def _forget(self, hold: Hold) -> None:
        self._holds.discard(hold)
        for rid in hold._ids:
            self._notices.pop(rid, None)

    def _request(self, conn: Connection, type_: int, body: Optional[bytes],
                 timeout: Optional[float], rid: Optional[int] = None):
        """One request on conn; its answer, or None if the connection broke (a missing answer
        within `timeout` breaks it)."""
        if rid is None:
            rid = next(self._ids)
        call = Call()
        if not conn.submit(rid, call, self._enc.frame(type_, rid, body)):
            return None
        if not conn.wait(call, timeout):
            conn.fail(f"no answer within {timeout} s")
            call.wait(None)
        return call.resp

    def _idempotent(self, type_: int, body: bytes):
        """A request that may be sent again: on a broken connection, once more on the next."""
        for attempt in (0, 1):
            resp = self._request(self._connection(), type_, body, self.request_timeout)
            if resp is not None:
                return resp
        raise ConnectionLost("the connection broke twice under the request")

    # Locks.

    def lock(self, name: str, *, wait: Optional[float] = None, lease: Optional[float] = None,
             shared: bool = False, limit: Optional[int] = None,
             value: Union[bytes, str, None] = None,
             lock_delay: Optional[float] = None) -> Hold:
        """Take `name` (one grant, with its own fencing token) and return the Hold, a context
        manager that releases it.

        wait: seconds to wait for it (None: until granted; 0: try once), then AcquireTimeout.
        lease: seconds; renewed in the background at a third of its length until released
        (None: held while the client's connection lives). shared: a shared (read) lock.
        limit: the key is a semaphore of this many holders. value: bytes (or text, as UTF-8)
        shown to get() and watchers. lock_delay: seconds the key stays unavailable to anyone
        after this grant ends by a loss or an expiry.
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be str, not {type(name).__name__}")
        if isinstance(value, str):
            value = value.encode()
        lease_us = None if lease is None else _wire.micros(lease, "lease")
        if lease_us == 0:
            raise ValueError("lease must be > 0 (None: held while the connection lives)")
        delay_us = None if lock_delay is None else _wire.micros(lock_delay, "lock_delay")
        deadline = None
        if wait is not None:
            deadline = time.monotonic() + wait if _wire.micros(wait, "wait") else None
        while True:
            conn = self._connection()
            if wait is None:
                wait_us: Optional[int] = None
            elif deadline is None:
                wait_us = 0
            else:
                wait_us = max(0, int((deadline - time.monotonic()) * 1_000_000))
            body = self._enc.lock_body(name, wait_us, lease_us, bool(shared), limit, value,
                                       delay_us)
            rid = next(self._ids)
            # The hold is made by whichever thread reads the answer, before it reads the next
            # frame: a loss notice right behind the grant finds it.
            box: List = [None, False]  # the hold; the caller gave up waiting

            def answered(resp, conn=conn, rid=rid, box=box):
                if resp is None or resp.status != _wire.OK:
                    return
                if box[1]:
                    self._give_back(conn, name, resp.fence)
                    return
                box[0] = self._granted(name, resp.fence, lease, conn, rid, call.sent_at)

            call = Call(answered)
            if not conn.submit(rid, call, self._enc.frame(_wire.LOCK, rid, body)):
                continue
            try:
                # A waiting Lock has no timeout of its own: the server answers when its wait
                # ends, and the keeper's Pings break a connection that stopped answering.
                conn.wait(call, None)
            except BaseException:
                # Interrupted while waiting: a grant that comes later is given back.
                box[1] = True
                if box[0] is not None:
                    box[0].release()
                raise
            resp = call.resp
            if resp is None:
                if deadline is not None and time.monotonic() >= deadline:
                    raise AcquireTimeout(name, wait)
                log.info("holdfast: lock %r: connection lost while waiting; asking again", name)
                continue
            if resp.status == _wire.OK:
                return box[0]
            if resp.status == _wire.ACQUIRE_TIMEOUT:
                raise AcquireTimeout(name, wait)
            raise _refused(resp)

    def _granted(self, name: str, fence: int, lease: Optional[float], conn: Connection,
                 rid: int, sent_at: float) -> Hold:
        # The server's lease runs from the grant. A grant that came at once counts from when
        # the Lock was sent (never later than the grant); one that waited counts from its
        # answer, and is renewed at once so that the next deadline is again one counted from a
        # request's sending.
        answered = time.monotonic()
        waited = answered - sent_at > _WAITED_S
        hold = Hold(self, name, fence, lease, conn, rid, answered if waited else sent_at)
        if waited and lease is not None:
            hold.renew_at = answered
        with self._mu:
            self._holds.add(hold)
            self._notices[rid] = hold
            if not conn.alive and lease is None:
                self._lose(hold, "the connection broke just after the grant")
            if lease is not None and (waited or hold.renew_at < self._keeper_wakes):
                self._wake.notify_all()
        return hold

    def _give_back(self, conn: Connection, name: str, fence: int) -> None:
        if conn.alive:
            rid = next(self._ids)
            conn.submit(rid, Call(), self._enc.frame(
                _wire.UNLOCK, rid, self._enc.body(name, fence=fence)))

    def _release(self, hold: Hold) -> None:
        with self._mu:
            if hold._released:
                return
            hold._released = True
            self._forget(hold)
            conn = hold._conn
            expired = hold.lease is not None and time.monotonic() >= hold.expires
        if conn is None or (not conn.alive and (hold.lease is None or expired)):
            return
        body = self._enc.body(hold.name, fence=hold.fence)
        if not conn.alive:
            # A lease whose connection broke: give it back through whichever server answers,
            # rather than leave it to run out.
            try:
                conn = self._connection()
            except Error:
                return
        resp = self._request(conn, _wire.UNLOCK, body, self.request_timeout)
        if resp is not None and resp.status not in (_wire.OK, _wire.NOT_HELD):
            log.warning("holdfast: unlock of %r (fence %d): %s", hold.name, hold.fence,
                        _refused(resp))

    def unlock(self, name: str, fence: int) -> bool:
        """End the grant of `name` with this fencing token, whoever holds it (an operator
        removing a stuck holder; its holder, if connected, is told it lost it). True if it was
        a current grant, False if not."""
        resp = self._idempotent(_wire.UNLOCK, self._enc.body(name, fence=fence))
        if resp.status == _wire.OK:
            return True
        if resp.status == _wire.NOT_HELD:
            return False
        raise _refused(resp)

    # Reading the state.

    def get(self, name: str) -> KeyInfo:
        """The key's holders (grant order), waiters, mode, limit and lock-delay left."""
        resp = self._idempotent(_wire.GET, self._enc.body(name))
        if resp.status != _wire.OK:
            raise _refused(resp)
        return KeyInfo._from(resp.info[0])

    def check_fence(self, name: str, fence: int) -> bool:
        """True if `fence` is a current grant of `name`."""
        resp = self._idempotent(_wire.CHECK_FENCE, self._enc.body(name, fence=fence))
        if resp.status == _wire.OK:
            return True
        if resp.status == _wire.STALE_FENCE:
            return False
        raise _refused(resp)

    def watch(self, name: str) -> Watch:
        """A Watch of `name`: iterate it for Events. The subscription starts before this
        returns (no event after it is missed while the connection lasts)."""
        w = Watch(self, name)
        with self._watch_mu:
            for _ in (0, 1):
                conn = self._connection()
                with self._mu:
                    sub = self._subs.get(name)
                    if sub is not None and sub.conn is conn and conn.alive:
                        sub.watchers.add(w)
                        joined = True
                    else:
                        joined = False
                if joined:
                    try:
                        w.info = self.get(name)
                    except Error:
                        pass
                    return w
                rid = next(self._ids)
                sub = _Subscription(name, rid, conn)
                sub.watchers.add(w)
                with self._mu:
                    self._subs[name] = sub
                    self._sub_ids[rid] = sub
                resp = self._request(conn, _wire.WATCH, self._enc.body(name), self.request_timeout,
                                     rid)
                if resp is None:
                    w._queue = queue.Queue()  # drop the ConnectionLost of the broken connection
                    continue
                if resp.status != _wire.OK:
                    with self._mu:
                        self._subs.pop(name, None)
                        self._sub_ids.pop(rid, None)
                    raise _refused(resp)
                w.info = KeyInfo._from(resp.info[0])
                return w
        raise ConnectionLost("the connection broke twice under the watch")

    def _unwatch(self, w: Watch) -> None:
        with self._watch_mu:
            with self._mu:
                sub = self._subs.get(w.name)
                if sub is None or w not in sub.watchers:
                    return
                sub.watchers.discard(w)
                if sub.watchers:
                    return
                del self._subs[w.name]
                self._sub_ids.pop(sub.request_id, None)
            if sub.conn.alive:
                resp = self._request(sub.conn, _wire.UNWATCH, self._enc.body(w.name),
                                     self.request_timeout)
                if resp is not None and resp.status != _wire.OK:
                    log.warning("holdfast: unwatch of %r: %s", w.name, _refused(resp))

    # Closing.

    def close(self) -> None:
        """Release every hold still held (by fence, bounded by request_timeout), end every
        watch and close the connection. Idempotent."""
        with self._mu:
            if self._closed:
                return
            holds = list(self._holds)
        for hold in holds:
            try:
                self._release(hold)
            except Error:
                pass
        with self._mu:
            self._closed = True
            for hold in list(self._holds):
                self._lose(hold, "the client was closed")
            subs = list(self._subs.values())
            self._subs.clear()
            self._sub_ids.clear()
            conn = self._conn
            self._wake.notify_all()
        for sub in subs:
            for w in sub.watchers:
                w._queue.put(_CLOSED)
        if conn is not None:
            conn.fail("closed by the client")
        self._keeper.join(self.request_timeout)

    # The keeper thread.

    def _keep(self) -> None:
        while True:
            with self._mu:
                if self._closed:
                    return
                now = time.monotonic()
                conn = self._conn
                next_at = now + self.ping_interval
                renew: List[Hold] = []
                reattach: List[Hold] = []
                for hold in list(self._holds):
                    if hold.lease is None:
                        continue
                    if now >= hold.lost_at:
                        self._lose(hold, f"its lease ({hold.lease} s) could not be renewed in time")
                        continue
                    next_at = min(next_at, hold.lost_at)
                    if hold._renewing:
                        continue
                    attached = hold._conn is not None and hold._conn.alive
                    if not attached and now < hold._retry_at:
                        next_at = min(next_at, hold._retry_at)
                    elif not attached:
                        reattach.append(hold)
                    elif now >= hold.renew_at:
                        renew.append(hold)
                    else:
                        next_at = min(next_at, hold.renew_at)
                stuck = self._stuck(conn, now)
                ping = False
                if conn is not None and conn.alive and not stuck:
                    if self._ping_call is None and now - conn.last_send >= self.ping_interval:
                        ping = True
                    next_at = min(next_at, conn.last_send + self.ping_interval)
                if not renew and not reattach and not stuck and not ping:
                    self._keeper_wakes = next_at
                    self._wake.wait(max(0.0, next_at - now))
                    self._keeper_wakes = 0.0
                    continue
            if stuck:
                conn.fail(stuck)
            if ping:
                self._ping(conn)
            for hold in renew:
                self._extend(hold, hold._conn)
            if reattach:
                try:
                    conn = self._connection()
                except Error as e:
                    log.debug("holdfast: leases waiting for a server: %s", e)
                    with self._mu:
                        # Until the next round, or sooner for a lease's deadline (next_at).
                        left = next_at - time.monotonic()
                        self._wake.wait(max(0.0, min(self.reconnect_delay, left)))
                    continue
                for hold in reattach:
                    log.info("holdfast: lock %r (fence %d): re-attaching to %s", hold.name,
                             hold.fence, conn.label)
                    self._extend(hold, conn)

    def _stuck(self, conn: Optional[Connection], now: float) -> Optional[str]:
        """Why conn must be given up (a Ping or an Extend unanswered too long), or None."""
        if conn is None or not conn.alive:
            return None
        ping = self._ping_call
        if ping is not None and now - ping.sent_at > self.request_timeout:
            return f"no answer to a Ping within {self.request_timeout} s"
        for hold in self._holds:
            call = hold._extend_call
            if (hold._renewing and hold._conn is conn and call is not None
                    and now - call.sent_at > max(hold.lease / 3, 1.0)):
                return f"no answer to an Extend within a third of the lease ({hold.lease} s)"
        return None

    def _ping(self, conn: Connection) -> None:
        def done(resp):
            with self._mu:
                self._ping_call = None
        call = Call(done)
        call.sent_at = time.monotonic()
        with self._mu:
            self._ping_call = call
        rid = next(self._ids)
        if not conn.submit(rid, call, self._enc.frame(_wire.PING, rid, None)):
            with self._mu:
                self._ping_call = None

    def _extend(self, hold: Hold, conn: Connection) -> None:
        """Extend by fence on conn (renewal there, or the move of the hold there)."""
        rid = next(self._ids)
        lease_us = _wire.micros(hold.lease, "lease")

        def done(resp):
            with self._mu:
                hold._renewing = False
                if hold._released or hold.lost.is_set():
                    return
                if resp is None:
                    return  # the connection broke: the keeper re-attaches on the next one
                if resp.status == _wire.OK:
                    hold._renewed(call.sent_at)
                    if hold._conn is not conn:
                        log.info("holdfast: lock %r (fence %d) kept on %s", hold.name,
                                 hold.fence, conn.label)
                    hold._conn = conn
                    for old in hold._ids:
                        if old != rid:
                            self._notices.pop(old, None)
                    hold._ids = [rid]
                elif resp.status == _wire.NOT_HELD:
                    self._lose(hold, "its lease is no longer held (NotHeld to Extend)")
                else:
                    log.warning("holdfast: renewal of %r (fence %d): %s; trying again",
                                hold.name, hold.fence, _refused(resp))
                    hold.renew_at = hold._retry_at = time.monotonic() + min(0.1, hold.lease / 10)
                self._wake.notify_all()

        call = Call(done)
        with self._mu:
            if hold._released or hold.lost.is_set():
                return
            hold._renewing = True
            hold._extend_call = call
            hold._ids.append(rid)
            self._notices[rid] = hold
        frame = self._enc.frame(_wire.EXTEND, rid,
                                self._enc.body(hold.name, fence=hold.fence, release_us=lease_us))
        if not conn.submit(rid, call, frame):
            with self._mu:
                hold._renewing = False

