"""Leader election on a lock with a value (docs/recipes.md, "Leader election"): campaign is a
waiting Lock with a lease and the candidate's value, the leader is the key's holder, observe is
a Watch, resign is an Unlock."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional, Union

from ._client import ConnectionLost, Hold

if TYPE_CHECKING:
    from ._client import Client

log = logging.getLogger("holdfast")


@dataclass(frozen=True)
class Leader:
    """Who leads: the term's fencing token and the leader's value."""

    fence: int
    value: bytes


class Election:
    """An election named `name` among candidates that campaign with their own `value`.

    lease: how long a leader that stopped renewing (a crash, a pause) keeps the office;
    lock_delay: how long after such an end nobody is elected (the old leader's writes in flight
    drain). A leader must stop acting as one when its hold's `lost` is set, and should put the
    hold's `fence` on every write.
    """

    def __init__(self, client: "Client", name: str, value: Union[bytes, str], *,
                 lease: float = 10.0, lock_delay: Optional[float] = None):
        self.client = client
        self.name = name
        self.value = value.encode() if isinstance(value, str) else value
        self.lease = lease
        self.lock_delay = lock_delay
        self._hold: Optional[Hold] = None

    def __repr__(self) -> str:
        state = "leading" if self.leading else "not leading"
        return f"<holdfast.Election {self.name!r} value={self.value!r} {state}>"

    @property
    def leading(self) -> bool:
        """True while this candidate holds the office (and has not lost it)."""
        return self._hold is not None and self._hold.held

    def campaign(self, wait: Optional[float] = None) -> Hold:
        """Wait until elected (at most `wait` seconds, else AcquireTimeout); return the term's
        Hold (`fence`, `lost`), a context manager that resigns on exit."""
        hold = self.client.lock(self.name, wait=wait, lease=self.lease, value=self.value,
                                lock_delay=self.lock_delay)
        self._hold = hold
        return hold

    def resign(self) -> None:
        """Leave the office at once (the next candidate is elected without a lock-delay)."""
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.release()

    def leader(self) -> Optional[Leader]:
        """The leader now, or None."""
        info = self.client.get(self.name)
        if not info.holders:
            return None
        h = info.holders[0]
        return Leader(h.fence, h.value)

    def observe(self) -> Iterator[Optional[Leader]]:
        """The leader now, then the leader after each change (None while there is none). Across
        a broken connection it watches again through the next server and says who leads then.
        Close the iterator (or leave the loop) to stop."""
        while True:
            try:
                w = self.client.watch(self.name)
            except ConnectionLost as e:
                log.info("holdfast: election %r: no server to observe through: %s", self.name, e)
                raise
            try:
                info = w.info
                yield Leader(info.holders[0].fence, info.holders[0].value) \
                    if info is not None and info.holders else None
                for ev in w:
                    if ev.kind == "acquired":
                        yield Leader(ev.fence, ev.value)
                    else:
                        yield None
                return
            except ConnectionLost as e:
                log.info("holdfast: election %r: watching again after: %s", self.name, e)
            finally:
                w.close()
