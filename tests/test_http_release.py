"""How a failed response gives its connection back before a retry's backoff, against a real
server (uvicorn on loopback): a small body whose server stalls is read for a bounded time only
(then the response is closed and the retry goes on), and a response that by HTTP has no body
(to HEAD; 204, 304) goes back to the pool whatever its ``Content-Length`` says."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from _uvicorn import read_body, serving

import stoic._http
import stoic.httpx
from stoic import RetryBudget, Retrying, Schedule
from stoic.aiohttp import ResilientMiddleware
from stoic.httpx import AsyncResilientTransport, ResilientTransport

pytestmark = pytest.mark.integration

CLIENT_TIMEOUT = 30.0  # seconds: the client's own read timeout, far over what a stalled drain may take
HUGE = 10_000_000  # bytes: a Content-Length far over the 64 KiB a failed body is read up to


class App:
    """Per path, the first hit fails and the later ones answer 200 (``hit N``), each hit's client
    port kept (the connection it came on).

    ``/stall-part/...``: the failure is a 503 with ``Content-Length: 100`` that sends 10 bytes
    of its body and then nothing until the client goes away; ``/stall-headers/...``: the same,
    no byte of the body sent. ``/nobody/<status>/...``: the failure is ``<status>`` (503, 204 or
    304) with ``Content-Length: 10000000`` and no body, as is every answer to a HEAD (whose
    200 says the same length; a GET's 200 is ``hit N``)."""

    def __init__(self) -> None:
        self.ports: dict[str, list[int]] = {}
        self.gone: dict[str, threading.Event] = {}  # set when a stalled response's client went away

    def stalled(self, path: str) -> threading.Event:
        return self.gone.setdefault(path, threading.Event())

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        path = scope["path"]
        hits = self.ports.setdefault(path, [])
        hits.append(scope["client"][1])
        first = len(hits) == 1
        if first and path.startswith("/stall-"):
            await send({"type": "http.response.start", "status": 503, "headers": [(b"content-length", b"100")]})
            if path.startswith("/stall-part/"):
                await send({"type": "http.response.body", "body": b"0123456789", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.stalled(path).set()
            return
        if path.startswith("/nobody/") and (first or scope["method"] == "HEAD"):
            status = int(path.split("/")[2]) if first else 200
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-length", str(HUGE).encode())]})
            await send({"type": "http.response.body", "body": b""})
            return
        text = f"hit {len(hits)}".encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(text)).encode())]})
        await send({"type": "http.response.body", "body": text})


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, App]]:
    app = App()
    with serving(app) as url:
        yield url, app


@pytest.fixture
def short_drain(monkeypatch: pytest.MonkeyPatch) -> float:
    """The drain's bound shortened to 50 ms (the default is longer, and real time passes here)."""
    monkeypatch.setattr(stoic._http, "DRAIN_TIMEOUT", 0.05)
    return 0.05


def retry() -> Retrying:
    return Retrying(Schedule.fixed(0).attempts(3), label="http-release", budget=RetryBudget.UNLIMITED)


def failure_too(status: int) -> Any:
    """An is_failure that also fails ``status`` (a 204 or 304 the caller treats as a failure)."""
    return lambda code: code >= 500 or code == status


# --- 1. a stalled small body is read for a bounded time, then closed --------------------------

STALLS = ["stall-part", "stall-headers"]


@pytest.mark.parametrize("stall", STALLS)
async def test_httpx_a_stalled_small_failed_body_is_dropped_after_the_bounded_drain(server, stall, short_drain):
    url, app = server
    path = f"/{stall}/httpx-async"
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(retry=retry()),
                                 timeout=CLIENT_TIMEOUT) as client, asyncio.timeout(5):
        r = await client.get(path)
    took = time.monotonic() - started
    assert r.status_code == 200 and r.text == "hit 2"
    assert took < 2.0  # the drain's bound, not the client's 30 s read timeout
    first, second = app.ports[path]
    assert first != second  # the stalled connection was closed, not reused
    assert await asyncio.to_thread(app.stalled(path).wait, 5)


@pytest.mark.parametrize("stall", STALLS)
def test_blocking_httpx_a_stalled_small_failed_body_is_dropped_after_the_bounded_drain(server, stall, short_drain):
    url, app = server
    path = f"/{stall}/httpx-sync"
    started = time.monotonic()
    with httpx.Client(base_url=url, transport=ResilientTransport(retry=retry()), timeout=CLIENT_TIMEOUT) as client:
        r = client.get(path)
        took = time.monotonic() - started
        # (the request it sent keeps the client's read timeout: the drain's was for the drain only)
        assert r.request.extensions["timeout"]["read"] == CLIENT_TIMEOUT
    assert r.status_code == 200 and r.text == "hit 2"
    assert took < 2.0
    first, second = app.ports[path]
    assert first != second
    assert app.stalled(path).wait(5)


@pytest.mark.parametrize("stall", STALLS)
async def test_aiohttp_a_stalled_small_failed_body_is_dropped_after_the_bounded_drain(server, stall, short_drain):
    url, app = server
    path = f"/{stall}/aiohttp"
    started = time.monotonic()
    # aiohttp's read timeout off, as a session may have it: only the drain's own bound remains
    async with aiohttp.ClientSession(base_url=url, middlewares=(ResilientMiddleware(retry=retry()),),
                                     timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as http, \
            asyncio.timeout(5), http.get(path) as r:
        assert r.status == 200 and await r.text() == "hit 2"
    took = time.monotonic() - started
    assert took < 2.0
    first, second = app.ports[path]
    assert first != second
    assert await asyncio.to_thread(app.stalled(path).wait, 5)


async def _cancelled_in_the_drain(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, request: Any) -> None:
    """Run ``request()`` as a task, cancel it once the adapter's drain (``module.name``) has
    started on the stalled body, and see it end cancelled."""
    entered = asyncio.Event()
    original = getattr(module, name)

    async def drain(response: Any) -> None:
        entered.set()
        await original(response)

    monkeypatch.setattr(module, name, drain)
    task = asyncio.create_task(request())
    async with asyncio.timeout(5):
        await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_httpx_a_request_cancelled_in_the_drain_still_closes_the_failed_response(server, monkeypatch):
    url, app = server
    path = "/stall-part/httpx-cancelled"
    monkeypatch.setattr(stoic._http, "DRAIN_TIMEOUT", 10.0)  # (the cancellation comes first)
    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(retry=retry()),
                                 timeout=CLIENT_TIMEOUT) as client:
        await _cancelled_in_the_drain(monkeypatch, stoic.httpx, "_drain_async", lambda: client.get(path))
        assert await asyncio.to_thread(app.stalled(path).wait, 5)  # its connection closed
        r = await client.get("/after/httpx-cancelled")  # the pool is usable
        assert r.status_code == 200
    assert len(app.ports[path]) == 1


async def test_aiohttp_a_request_cancelled_in_the_drain_still_releases_the_failed_response(server, monkeypatch):
    url, app = server
    path = "/stall-part/aiohttp-cancelled"
    monkeypatch.setattr(stoic._http, "DRAIN_TIMEOUT", 10.0)
    async with aiohttp.ClientSession(base_url=url, middlewares=(ResilientMiddleware(retry=retry()),),
                                     connector=aiohttp.TCPConnector(limit=1)) as http:

        async def get() -> None:
            async with http.get(path):
                pass

        await _cancelled_in_the_drain(monkeypatch, stoic.aiohttp, "_drain", get)
        assert await asyncio.to_thread(app.stalled(path).wait, 5)
        async with http.get("/after/aiohttp-cancelled", timeout=aiohttp.ClientTimeout(total=5, connect=0.5)) as r:
            assert r.status == 200  # the pool's one slot was given back
    assert len(app.ports[path]) == 1


# --- 2. a response with no body by HTTP goes back to the pool whatever its length says ------

# (method, the first answer's status, is_failure): a HEAD's 503, and a GET's 204 or 304 that the
# caller counts as a failure; each answer says Content-Length: 10000000 and has no body.
NO_BODY = [("HEAD", 503, None), ("GET", 204, failure_too(204)), ("GET", 304, failure_too(304))]
NO_BODY_IDS = ["head-503", "get-204", "get-304"]


@pytest.mark.parametrize(("method", "status", "is_failure"), NO_BODY, ids=NO_BODY_IDS)
async def test_httpx_a_failed_response_without_a_body_keeps_its_connection(server, method, status, is_failure):
    url, app = server
    path = f"/nobody/{status}/httpx-async-{method}"
    transport = AsyncResilientTransport(httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1)),
                                        retry=retry(), is_failure=is_failure)
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=5) as client:
        r = await client.request(method, path)
    assert r.status_code == 200 and r.content == (b"" if method == "HEAD" else b"hit 2")
    first, second = app.ports[path]
    assert first == second  # the one connection, reused


@pytest.mark.parametrize(("method", "status", "is_failure"), NO_BODY, ids=NO_BODY_IDS)
def test_blocking_httpx_a_failed_response_without_a_body_keeps_its_connection(server, method, status, is_failure):
    url, app = server
    path = f"/nobody/{status}/httpx-sync-{method}"
    transport = ResilientTransport(httpx.HTTPTransport(limits=httpx.Limits(max_connections=1)), retry=retry(),
                                   is_failure=is_failure)
    with httpx.Client(base_url=url, transport=transport, timeout=5) as client:
        r = client.request(method, path)
    assert r.status_code == 200 and r.content == (b"" if method == "HEAD" else b"hit 2")
    first, second = app.ports[path]
    assert first == second


@pytest.mark.parametrize(("method", "status", "is_failure"), NO_BODY, ids=NO_BODY_IDS)
async def test_aiohttp_a_failed_response_without_a_body_keeps_its_connection(server, method, status, is_failure):
    url, app = server
    path = f"/nobody/{status}/aiohttp-{method}"
    middleware = ResilientMiddleware(retry=retry(), is_failure=is_failure)
    async with aiohttp.ClientSession(base_url=url, middlewares=(middleware,),
                                     connector=aiohttp.TCPConnector(limit=1)) as http, \
            http.request(method, path, timeout=aiohttp.ClientTimeout(total=5)) as r:
        assert r.status == 200 and await r.read() == (b"" if method == "HEAD" else b"hit 2")
    first, second = app.ports[path]
    assert first == second


@pytest.mark.parametrize(("method", "status", "length", "read"), [
    ("HEAD", 503, str(HUGE), True), ("head", 200, None, True),  # nothing to read, whatever the length
    ("GET", 101, str(HUGE), True), ("GET", 204, str(HUGE), True), ("GET", 304, None, True),
    ("GET", 503, "100", True), ("GET", 503, str(HUGE), False), ("GET", 503, None, False),
    ("PUT", 200, str(HUGE), False),
])
def test_which_failed_responses_are_read_before_release(method, status, length, read):
    assert stoic._http.drain_first(method, status, length) is read
