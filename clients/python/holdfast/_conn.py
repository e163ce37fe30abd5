"""One connection to one server: requests multiplexed by id, answered out of order.

Any thread sends (under a lock, whole frames); one reader thread per connection reads every
frame and hands it on: an answer to the call waiting for its id, an event frame (a watch's event
or a loss notice) to the client. When the connection breaks, every call in flight is completed
with None and the client is told once.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
import time
from typing import Callable, Dict, Optional, Tuple

from . import _wire

log = logging.getLogger("holdfast")

_READ_CHUNK = 256 * 1024
# The background reader's pause when it finds a caller reading.
_YIELD_S = 0.001


class Call:
    """An answer to come. The waiting thread blocks on a plain lock that the reader releases."""

    __slots__ = ("_done", "done", "resp", "callback", "sent_at")

    def __init__(self, callback: Optional[Callable] = None):
        self._done = threading.Lock()
        self._done.acquire()
        self.done = False
        self.resp = None
        self.callback = callback
        self.sent_at = 0.0

    def complete(self, resp) -> None:
        """The callback first: the waiting thread finds what it did."""
        self.resp = resp
        cb = self.callback
        if cb is not None:
            try:
                cb(resp)
            except Exception:  # a callback's bug must not stop the reader
                log.exception("holdfast: callback failed")
        self.done = True
        self._done.release()

    def wait(self, timeout: Optional[float]) -> bool:
        return self._done.acquire(timeout=-1 if timeout is None else timeout)


class Connection:
    def __init__(self, address: Tuple[str, int], sock: socket.socket, tls: bool,
                 on_event: Callable, on_closed: Callable):
        self.address = address
        self.label = f"{address[0]}:{address[1]}"
        self._sock = sock
        self._tls = tls
        self._on_event = on_event
        self._on_closed = on_closed
        # Frames waiting to be written, and whether a thread is writing them.
        self._out_mu = threading.Lock()
        self._out: list = []
        self._writing = False
        self._state_mu = threading.Lock()
        # TLS: one SSL object must not be read and written at once; both go through this lock,
        # the socket non-blocking, the reader waiting in select() without it.
        self._io_mu = threading.Lock()
        # Who reads the socket now (a waiting caller, or the background reader), and the bytes
        # of a frame not yet whole.
        self._read_mu = threading.Lock()
        self._buf = bytearray()
        self._pending: Dict[int, Call] = {}
        self.alive = True
        self.last_send = time.monotonic()
        self.error: Optional[str] = None
        if tls:
            sock.setblocking(False)
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"holdfast-reader-{self.label}")

    def start(self) -> None:
        self._reader.start()

    def __repr__(self) -> str:
        state = "open" if self.alive else f"closed ({self.error})"
        return f"<holdfast connection to {self.label}, {state}, {len(self._pending)} in flight>"

    # Sending.

    def submit(self, request_id: int, call: Call, frame: bytes) -> bool:
        """Send a frame whose answer completes `call`; False (call not registered) when the
        connection is already gone."""
        with self._state_mu:
            if not self.alive:
                return False
            self._pending[request_id] = call
        call.sent_at = time.monotonic()
        try:
            self._send(frame)
        except OSError as e:
            self.fail(f"send failed: {e}")
        return True

    def _send(self, frame: bytes) -> None:
        """Queue the frame; the thread that finds nobody writing writes everything queued
        (frames other threads add while it writes go out in its next write, not one each)."""
        with self._out_mu:
            self._out.append(frame)
            if self._writing:
                return
            self._writing = True
        try:
            while True:
                with self._out_mu:
                    if not self._out:
                        self._writing = False
                        return
                    data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
                    self._out.clear()
                if not self._tls:
                    self._sock.sendall(data)
                else:
                    self._send_tls(data)
                self.last_send = time.monotonic()
        except BaseException:
            with self._out_mu:
                self._writing = False
            raise

    def _send_tls(self, frame: bytes) -> None:
        view = memoryview(frame)
        while view:
            with self._io_mu:
                try:
                    n = self._sock.send(view)
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    n = 0
            if n:
                view = view[n:]
            else:
                select.select([], [self._sock], [], 0.05)

    # Reading.

    def wait(self, call: Call, timeout: Optional[float]) -> bool:
        """Wait for call's answer. On a plain socket the waiting thread reads the socket itself
        when no other thread does (no hand-over between threads for the answer); otherwise the
        thread that reads completes the call. False: no answer within timeout."""
        if call.done:
            return True
        if self._tls or not self._read_mu.acquire(blocking=False):
            return call.wait(timeout)
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not call.done and self.alive:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([self._sock], [], [], left)[0]:
                        break
                try:
                    data = self._sock.recv(_READ_CHUNK)
                except OSError as e:
                    self.fail(str(e) or type(e).__name__)
                    break
                if not data:
                    self.fail("closed by the server")
                    break
                self._process(data)
        finally:
            self._read_mu.release()
        return call.wait(0)

    def _process(self, data: bytes) -> None:
        """With _read_mu held: take in bytes, hand on every whole frame."""
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 4:
            n = int.from_bytes(buf[pos:pos + 4], "big")
            if end - pos - 4 < n:
                break
            resp = _wire.response(bytes(buf[pos + 4:pos + 4 + n]))
            pos += 4 + n
            if resp.HasField("event"):
                self._on_event(self, resp)
            else:
                call = self._pending.pop(resp.request_id, None)
                if call is not None:
                    call.complete(resp)
                else:
                    log.debug("holdfast: %s: an answer to no request (%d)", self.label,
                              resp.request_id)
        if pos:
            del buf[:pos]

    def _read_loop(self) -> None:
        """The background reader: events and loss notices while nobody waits, and the answers
        of callers that found another thread reading."""
        try:
            if self._tls:
                self._read_loop_tls()
            else:
                self._read_loop_plain()
        except Exception as e:  # a bug here must still end the connection cleanly
            log.exception("holdfast: %s: reader failed", self.label)
            self.fail(repr(e))

    def _read_loop_plain(self) -> None:
        sock = self._sock
        while self.alive:
            try:
                if not select.select([sock], [], [], 1.0)[0]:
                    continue
            except (OSError, ValueError) as e:
                self.fail(str(e) or type(e).__name__)
                return
            if not self._read_mu.acquire(blocking=False):
                # A caller reads (and hands on whatever comes); look again a little later
                # rather than take the socket from under the next caller.
                time.sleep(_YIELD_S)
                continue
            try:
                while self.alive:
                    try:
                        data = sock.recv(_READ_CHUNK, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        break
                    except OSError as e:
                        self.fail(str(e) or type(e).__name__)
                        return
                    if not data:
                        self.fail("closed by the server")
                        return
                    self._process(data)
            finally:
                self._read_mu.release()

    def _read_loop_tls(self) -> None:
        sock = self._sock
        while self.alive:
            with self._io_mu:
                try:
                    data = sock.recv(_READ_CHUNK)
                    while sock.pending():
                        data += sock.recv(_READ_CHUNK)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    data = None
                except (OSError, ValueError) as e:
                    self.fail(str(e) or type(e).__name__)
                    return
            if data is None:
                try:
                    select.select([sock], [], [], 1.0)
                except (OSError, ValueError):
                    pass
                continue
            if not data:
                self.fail("closed by the server")
                return
            with self._read_mu:
                self._process(data)

    # Ending.

    def fail(self, reason: str) -> None:
        """Close the connection (idempotent); calls in flight get None; the client is told."""
        with self._state_mu:
            if not self.alive:
                return
            self.alive = False
            self.error = reason
            pending, self._pending = self._pending, {}
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        for call in pending.values():
            call.complete(None)
        self._on_closed(self, reason)
