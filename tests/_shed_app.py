"""The load-shedding test's server apps, importable so uvicorn can serve them in their own
process (the load generator then never competes with the server for one interpreter's GIL).

``queued``: a backend with a fixed capacity (``CAPACITY`` requests at once, ``SERVICE_TIME``
seconds each; the rest queue). ``shed``: the same backend behind ``LoadShedding`` with a bulkhead
of that capacity and no queue. ``GET /most`` answers the most requests the backend ever held.
"""

from __future__ import annotations

import asyncio
from typing import Any

from stoic import Bulkhead
from stoic.asgi import LoadShedding

SERVICE_TIME = 0.2
CAPACITY = 4


class Backend:
    def __init__(self) -> None:
        self.capacity: asyncio.Semaphore | None = None
        self.most = 0
        self.inside = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/most":
            body = str(self.most).encode()
        else:
            if self.capacity is None:
                self.capacity = asyncio.Semaphore(CAPACITY)
            async with self.capacity:
                self.inside += 1
                self.most = max(self.most, self.inside)
                try:
                    await asyncio.sleep(SERVICE_TIME)
                finally:
                    self.inside -= 1
            body = b"ok"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})


queued = Backend()
_backend = Backend()


async def shed(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"] == "/most":
        await _backend(scope, receive, send)  # not through the bulkhead: a reading, not load
    else:
        await _shedding(scope, receive, send)


_shedding = LoadShedding(_backend, bulkhead=Bulkhead(CAPACITY, queue_limit=0, label="ingress"))
