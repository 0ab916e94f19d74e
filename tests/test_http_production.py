"""What production traffic does to the HTTP integrations that the other tests here do not try: a
``Retry-After`` a proxy sent twice, a caller that gives up on its request while it is the
breaker's half-open probe, a shed request whose unread body shares a kept-alive connection,
a retry given as a stage. Real loopback HTTP (uvicorn) where the protocol matters, virtual
time where the policy's does."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from _uvicorn import read_body, serving

import stoic
from stoic import (
    BreakerState,
    Bulkhead,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    CountWindow,
    Hedge,
    OpenDuration,
    Pipeline,
    RetryBudget,
    Retrying,
    Schedule,
)
from stoic.aiohttp import ResilientMiddleware
from stoic.asgi import LoadShedding
from stoic.httpx import AsyncResilientTransport, ResilientTransport
from stoic.testing import RecordingSink, VirtualClock


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


async def test_a_caller_cancelled_during_the_half_open_probe_leaves_the_breaker_probing(clock: VirtualClock):
    # The one probe of a half-open breaker hangs and its caller gives up (a client timeout, a
    # cancelled handler): the permit must come back, or every request is refused until
    # half_open_timeout, and the bulkhead slot with it.
    hang = True

    async def dependency(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/fail":
            return httpx.Response(503)
        if hang:
            await asyncio.Event().wait()
        return httpx.Response(200)

    breaker = CircuitBreaker(label="dep", window=CountWindow(2), minimum_calls=2, open_duration=OpenDuration.fixed(10))
    bulkhead = Bulkhead(1, queue_limit=0, label="dep-slots")
    transport = AsyncResilientTransport(httpx.MockTransport(dependency), stages=[breaker, bulkhead])
    async with httpx.AsyncClient(base_url="http://dep", transport=transport) as client:
        for _ in range(2):
            assert (await client.get("/fail")).status_code == 503
        assert breaker.state is BreakerState.OPEN
        await clock.advance(10)
        probe = asyncio.ensure_future(client.get("/probe"))
        await clock.advance(0)
        assert breaker.state is BreakerState.HALF_OPEN and bulkhead.in_use == 1
        with pytest.raises(CircuitOpen):
            await client.get("/other")  # the probe's permit is taken
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
        assert bulkhead.in_use == 0
        hang = False
        assert (await client.get("/probe")).status_code == 200  # admitted as the next probe
        assert breaker.state is BreakerState.CLOSED


class Gate:
    """An admission policy that refuses every request while ``full`` (a bulkhead whose every
    slot another request holds), then admits them all."""

    def __init__(self) -> None:
        self.full = True

    async def execute(self, fn: Any, *args: Any) -> Any:
        if self.full:
            raise BulkheadFull(label="ingress")
        return await fn(*args)


@pytest.mark.integration
@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_shed_request_with_an_unread_body_leaves_its_keep_alive_connection_in_step(http):
    # LoadShedding answers a refused POST without reading its body. On a kept-alive connection
    # the server must skip that body, not parse it as the next request (a body that reads as
    # "GET /smuggled" would be one), and the next request on the connection is answered.
    pytest.importorskip(http)
    seen: list[str] = []

    async def echo(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        body = await read_body(receive)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    gate = Gate()
    with serving(LoadShedding(echo, bulkhead=gate), http=http) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            inside = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
            conn.sendall(b"POST /shed HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(inside), inside))
            first = read_response(conn)
            assert first.startswith(b"HTTP/1.1 503")
            gate.full = False
            conn.sendall(b"POST /next HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
            second = read_response(conn)
    assert second.startswith(b"HTTP/1.1 200") and second.endswith(b"\r\n\r\nabc") and seen == ["/next"]


def read_response(conn: socket.socket) -> bytes:
    """One whole HTTP/1.1 response (its head and a ``Content-Length`` body) from ``conn``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed: {data + body!r}"
        body += chunk
    assert len(body) == length, "more than one response's worth of bytes"
    return head + b"\r\n\r\n" + body


class FailsTwice:
    """Per path, two 503s and then 200 ``ok``; under ``/chunked/`` the 503s have no length and a
    100 KB body (closed unread before a retry), else ``Content-Length: 4`` (read, connection
    reused). Every client port a request came from is kept."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.ports: set[int] = set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        path = scope["path"]
        self.hits[path] = self.hits.get(path, 0) + 1
        self.ports.add(scope["client"][1])
        if self.hits[path] <= 2:
            chunked = path.startswith("/chunked/")
            await send({"type": "http.response.start", "status": 503,
                        "headers": [] if chunked else [(b"content-length", b"4")]})
            await send({"type": "http.response.body", "body": b"down" if not chunked else b"x" * 100_000})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


POOL = 4
CALLERS = 24


def generous_retry() -> Retrying:
    return Retrying(Schedule.fixed(0.01).attempts(3), label="pool-retry",
                    budget=RetryBudget(1.0, reserve_per_second=1000, reserve_capacity=1000))


@pytest.mark.integration
@pytest.mark.parametrize("body", ["sized", "chunked"])
async def test_many_callers_retrying_503s_through_a_small_pool_leave_it_idle(body):
    # 24 callers at once through a pool of 4, every request failing twice before its 200: each
    # gets its 200 (no request starves behind connections that failed attempts hold), and the
    # pool ends with no connection in use. A small sized 503 is read and its connection reused,
    # so the server sees no more connections than the pool holds.
    app = FailsTwice()
    with serving(app) as url:
        inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=POOL))
        transport = AsyncResilientTransport(inner, retry=generous_retry())
        async with httpx.AsyncClient(base_url=url, transport=transport, timeout=10) as client:
            answers = await asyncio.gather(*(client.get(f"/{body}/httpx/{n}") for n in range(CALLERS)))
            assert [r.status_code for r in answers] == [200] * CALLERS
            pool = inner._pool.connections
            assert len(pool) <= POOL and all(connection.is_idle() for connection in pool)
        if body == "sized":
            assert len(app.ports) <= POOL
        app.ports.clear()
        connector = aiohttp.TCPConnector(limit=POOL)
        middleware = ResilientMiddleware(retry=generous_retry())
        async with aiohttp.ClientSession(base_url=url, middlewares=(middleware,), connector=connector) as session:
            async def one(n: int) -> int:
                async with session.get(f"/{body}/aiohttp/{n}") as response:
                    await response.read()
                    return response.status

            assert await asyncio.gather(*(one(n) for n in range(CALLERS))) == [200] * CALLERS
            assert not connector._acquired
        if body == "sized":
            assert len(app.ports) <= POOL


class Dribble:
    """200 and its headers at once, then the body's one byte only once ``release`` is set (a
    slow download), read by the test from another thread."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]})
        while not self.release.is_set():
            await asyncio.sleep(0.005)
        await send({"type": "http.response.body", "body": b"!"})


@pytest.mark.integration
async def test_a_bulkhead_stage_holds_its_slot_up_to_the_response_headers_not_through_the_body():
    # What a stage bounds: the attempt, up to the response's headers (the transport and the
    # middleware return there; the body is read by the caller afterwards). A Bulkhead(1) in
    # the stages does not cap downloads in progress: with one body still coming, the slot is
    # free and a second request is admitted. (docs/httpx.md, docs/aiohttp.md say so.)
    app = Dribble()
    with serving(app) as url:
        bulkhead = Bulkhead(1, queue_limit=0, label="downloads")
        transport = AsyncResilientTransport(stages=[bulkhead])
        async with httpx.AsyncClient(base_url=url, transport=transport, timeout=10) as client, \
                client.stream("GET", "/one") as first:
            assert first.status_code == 200 and bulkhead.in_use == 0
            second = asyncio.ensure_future(client.get("/two"))
            await asyncio.sleep(0)  # (the second request is through the bulkhead: not refused)
            app.release.set()
            assert await first.aread() == b"!" and (await second).content == b"!"
        app.release.clear()
        middleware = ResilientMiddleware(stages=[bulkhead])
        async with aiohttp.ClientSession(base_url=url, middlewares=(middleware,)) as session, \
                session.get("/one") as response:
            assert response.status == 200 and bulkhead.in_use == 0
            app.release.set()
            assert await response.read() == b"!"


@pytest.mark.parametrize("adapter", [AsyncResilientTransport, ResilientTransport, ResilientMiddleware])
def test_a_retry_or_a_hedge_given_as_a_stage_is_refused_at_construction(adapter):
    # stages=[breaker, Retrying(...)] reads like retry=, and a Retrying has execute and call, so
    # it was taken as a stage: it retried inside the stages, where no rule of retry= applies. A
    # POST was sent three times (docs: "A POST is never repeated unless you add it"), a stream
    # body sent again, and every failed response held through the backoff. A Hedge as a stage
    # failed every request (its execute takes IDEMPOTENT first). Both are refused, naming the
    # keyword that takes them.
    retry = Retrying(Schedule.fixed(0.01).attempts(3), label="stage-retry")
    breaker = CircuitBreaker(label="dep")
    for stage in (retry, Pipeline(breaker, retry)):
        with pytest.raises(TypeError, match="retry="):
            adapter(stages=[breaker, stage] if stage is retry else [stage])
    with pytest.raises(TypeError, match="hedge="):
        adapter(stages=[Hedge(0.05, label="stage-hedge")])



class ServeStale:
    """A stage of the user's own: on a failure of the attempt (a 5xx included, raised as
    ServerError inside the stages), answers a cached response instead."""

    def __init__(self, cached: Any) -> None:
        self.cached = cached

    async def execute(self, fn: Any, *args: Any) -> Any:
        try:
            return await fn(*args)
        except Exception:
            return self.cached()

    def call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            return self.cached()


class Closes(httpx.AsyncByteStream, httpx.SyncByteStream):
    """A 503's body that counts its closes (its connection given back)."""

    def __init__(self) -> None:
        self.closed = 0

    async def __aiter__(self) -> Any:
        yield b"down"

    def __iter__(self) -> Any:
        yield b"down"

    async def aclose(self) -> None:
        self.closed += 1

    def close(self) -> None:
        self.closed += 1


async def test_a_failed_response_a_stage_answered_in_place_of_is_closed():
    # A stage may answer instead of the attempt (a stale cache on a 5xx). The failed response
    # it replaced is never the caller's, so it must be closed: it was, only when the request
    # had made more than one response. With one attempt, the 503 was left open, its connection
    # held until garbage collection (a pool of N exhausted after N such requests).
    bodies: list[Closes] = []

    def failing(request: httpx.Request) -> httpx.Response:
        bodies.append(Closes())
        return httpx.Response(503, stream=bodies[-1])

    stale = ServeStale(lambda: httpx.Response(200, content=b"stale"))
    async with httpx.AsyncClient(transport=AsyncResilientTransport(httpx.MockTransport(failing),
                                                                   stages=[stale])) as client:
        response = await client.get("http://dep/")
    assert response.text == "stale" and [body.closed for body in bodies] == [1]
    bodies.clear()
    with httpx.Client(transport=ResilientTransport(httpx.MockTransport(failing), stages=[stale])) as sync:
        response = sync.get("http://dep/")
    assert response.text == "stale" and [body.closed for body in bodies] == [1]
