"""holdfast: a client of holdfast's native lock protocol (dlock version 3).

    import holdfast
    c = holdfast.Client(["10.0.0.1:2627", "10.0.0.2:2627"])
    with c.lock("nightly", wait=10.0, lease=30.0, value=b"host-a") as held:
        ...  # held.fence, held.lost

See the README for the whole surface.
"""

from ._client import (AcquireTimeout, Client, ConnectionLost, Error, Event, Hold, Holder,
                      KeyInfo, RequestError, Watch)
from ._election import Election, Leader

__version__ = "0.1.0"

__all__ = ["AcquireTimeout", "Client", "ConnectionLost", "Election", "Error", "Event", "Hold",
           "Holder", "KeyInfo", "Leader", "RequestError", "Watch", "__version__"]
