"""What production traffic does to the HTTP integrations that the other tests here do not try,
first of all a ``Retry-After`` a proxy sent twice. Real loopback HTTP (uvicorn) where the
protocol matters, virtual time where the policy's time does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from _uvicorn import read_body, serving

import stoic
from stoic import Retrying, Schedule
from stoic.aiohttp import ResilientMiddleware
from stoic.httpx import AsyncResilientTransport, ResilientTransport
from stoic.testing import RecordingSink


class Twice:
    """Per path, the first hit is a 503 carrying ``Retry-After`` twice (the value after
    ``/twice/<value>/``, repeated: a proxy that adds the header the origin sent already), later
    hits 200."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        path = scope["path"]
        self.hits[path] = self.hits.get(path, 0) + 1
        if self.hits[path] == 1:
            value = path.split("/")[2].encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-length", b"4"), (b"retry-after", value), (b"retry-after", value)]})
            await send({"type": "http.response.body", "body": b"down"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def twice() -> Iterator[str]:
    with serving(Twice()) as url:
        yield url


def waits(sink: RecordingSink) -> list[tuple[str, float]]:
    return [(e.attributes["decision"], e.attributes["next_delay"]) for e in sink.of("retry.attempt_failed")]


CAP = 0.05  # seconds: the Retry-After honoured at most, so that the test waits little of real time
# (what the server asks, 120 s, is over it: honoured means a wait of CAP, ignored the schedule's 0.01)
HONOURED = [("retry_after", CAP)]


def retry() -> Retrying:
    return Retrying(Schedule.fixed(0.01).attempts(2), label="http-retry")


@pytest.mark.integration
async def test_a_retry_after_sent_twice_is_honoured_by_the_httpx_transport_as_by_aiohttp(twice):
    # A singleton header repeated (RFC 9110 5.3: not a list; a proxy or a framework that adds
    # its own copy) reached httpx's headers.get() joined as "120, 120", which is no Retry-After
    # at all: the async and blocking transports retried on the schedule's 10 ms while aiohttp,
    # reading the first value, waited as the server asked. Both adapters must read it alike.
    sink = RecordingSink()
    with stoic.use_sinks(sink):
        transport = AsyncResilientTransport(retry=retry(), retry_after_cap=CAP)
        async with httpx.AsyncClient(base_url=twice, transport=transport) as client:
            r = await client.get("/twice/120/async")
        assert r.status_code == 200 and waits(sink) == HONOURED
        sink.clear()
        with httpx.Client(base_url=twice, transport=ResilientTransport(retry=retry(), retry_after_cap=CAP)) as sync:
            r = sync.get("/twice/120/sync")
        assert r.status_code == 200 and waits(sink) == HONOURED
        sink.clear()
        middleware = ResilientMiddleware(retry=retry(), retry_after_cap=CAP)
        async with aiohttp.ClientSession(base_url=twice, middlewares=(middleware,)) as session, \
                session.get("/twice/120/aiohttp") as response:
            assert response.status == 200
        assert waits(sink) == HONOURED
