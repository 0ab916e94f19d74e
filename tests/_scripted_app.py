"""A small pure-ASGI app the HTTP integration tests call over real loopback HTTP (uvicorn).

- ``/ok``: 200 ``ok``.
- ``/status/{code}``: that status; ``?retry_after=VALUE`` adds a ``Retry-After`` header.
- ``/flaky/{name}?fail=N&code=503``: fails with ``code`` for the first N hits of ``name``, then 200.
- ``/slow/{name}?first=S``: the first hit of ``name`` waits S seconds, later hits answer at once.
- ``/sleep?seconds=S``: waits S seconds, then 200.
- ``/drip?seconds=S``: sends 200 and its headers at once, the body ``ok`` S seconds later.
``hits[name]`` counts the hits of every path (by its last segment for the named ones).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any
from urllib.parse import parse_qs


class ScriptedApp:
    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while True:  # drain the request body
            message = await receive()
            if not message.get("more_body"):
                break
        path: str = scope["path"]
        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        parts = path.strip("/").split("/")
        status, headers, body = 200, [], b"ok"
        if parts[0] == "status":
            self.hits[path] += 1
            status = int(parts[1])
            body = f"status {status}".encode()
            if "retry_after" in query:
                headers.append((b"retry-after", query["retry_after"].encode()))
        elif parts[0] == "flaky":
            name = parts[1]
            self.hits[name] += 1
            if self.hits[name] <= int(query.get("fail", "1")):
                status = int(query.get("code", "503"))
                body = b"failing"
                if "retry_after" in query:
                    headers.append((b"retry-after", query["retry_after"].encode()))
        elif parts[0] == "slow":
            name = parts[1]
            self.hits[name] += 1
            if self.hits[name] == 1:
                await asyncio.sleep(float(query.get("first", "1")))
            body = f"hit {self.hits[name]}".encode()
        elif parts[0] == "sleep":
            self.hits["sleep"] += 1
            await asyncio.sleep(float(query.get("seconds", "0")))
        elif parts[0] == "drip":
            self.hits["drip"] += 1
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
            await asyncio.sleep(float(query.get("seconds", "0")))
            await send({"type": "http.response.body", "body": b"ok"})
            return
        else:
            self.hits[path] += 1
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain"), *headers]})
        await send({"type": "http.response.body", "body": body})
