"""A hostile production user's review of the HTTP client integrations, against a real server
(uvicorn on loopback): a retried request must not hold its failed attempts' connections while
it needs one, and a request body that can be read only once is never sent twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from _uvicorn import read_body, serving

from stoic import Retrying, Schedule
from stoic.aiohttp import ResilientMiddleware
from stoic.httpx import AsyncResilientTransport, ResilientTransport, parse_retry_after

pytestmark = pytest.mark.integration


class Recorder:
    """Answers 503 to the first hit of every path (with ``Retry-After`` when the query is
    ``retry_after=S``), 200 after, and always 200 under ``/healthy``; keeps every body it received."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        seen = self.bodies.setdefault(scope["path"], [])
        seen.append(body)
        status = 503 if len(seen) == 1 and not scope["path"].startswith("/healthy") else 200
        text = f"hit {len(seen)}".encode()
        # (under /chunked/ no length: uvicorn sends the body chunked, so it is not read before a retry)
        headers = [] if scope["path"].startswith("/chunked/") else [(b"content-length", str(len(text)).encode())]
        query = scope.get("query_string", b"")
        if query.startswith(b"retry_after="):
            headers.append((b"retry-after", query.removeprefix(b"retry_after=")))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": text})


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Recorder]]:
    app = Recorder()
    with serving(app) as url:
        yield url, app


def retry() -> Retrying:
    return Retrying(Schedule.fixed(0.01).attempts(3), label="http-retry")


async def test_a_retried_request_does_not_wait_for_the_connection_its_failed_attempt_holds(server):
    url, app = server
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1))
    transport = AsyncResilientTransport(inner, retry=retry())
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=2.0) as client:
        r = await client.get("/pool/async")
    assert r.status_code == 200 and r.text == "hit 2" and len(app.bodies["/pool/async"]) == 2


def test_a_blocking_retried_request_does_not_wait_for_the_connection_its_failed_attempt_holds(server):
    url, app = server
    inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=1))
    with httpx.Client(base_url=url, transport=ResilientTransport(inner, retry=retry()), timeout=2.0) as client:
        r = client.get("/pool/sync")
    assert r.status_code == 200 and r.text == "hit 2" and len(app.bodies["/pool/sync"]) == 2


async def test_an_httpx_streamed_body_is_not_retried_and_the_failed_response_is_returned(server):
    url, app = server

    async def body() -> AsyncIterator[bytes]:
        yield b"streamed "
        yield b"once"

    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(retry=retry())) as client:
        r = await client.put("/stream/httpx", content=body())
        assert r.status_code == 503 and r.text == "hit 1"  # the server's answer, not StreamConsumed
        r = await client.put("/bytes/httpx", content=b"in memory")  # a body in memory is retried
        assert r.status_code == 200
    assert app.bodies["/stream/httpx"] == [b"streamed once"]
    assert app.bodies["/bytes/httpx"] == [b"in memory", b"in memory"]


def test_a_blocking_httpx_file_body_is_not_retried_and_the_failed_response_is_returned(server, tmp_path):
    url, app = server
    path = tmp_path / "upload"
    path.write_bytes(b"file content")
    with httpx.Client(base_url=url, transport=ResilientTransport(retry=retry())) as client, path.open("rb") as f:
        r = client.put("/file/httpx", content=f)
        assert r.status_code == 503 and r.text == "hit 1"  # not h11's "too little data" on a retry
    assert app.bodies["/file/httpx"] == [b"file content"]


async def test_an_aiohttp_streamed_body_is_not_retried_with_an_empty_body(server):
    url, app = server

    async def body() -> AsyncIterator[bytes]:
        yield b"streamed "
        yield b"once"

    async with aiohttp.ClientSession(base_url=url, middlewares=(ResilientMiddleware(retry=retry()),)) as http:
        async with http.put("/stream/aiohttp", data=body()) as r:
            assert r.status == 503 and await r.text() == "hit 1"
        async with http.put("/bytes/aiohttp", data=b"in memory") as r:
            assert r.status == 200
    assert app.bodies["/stream/aiohttp"] == [b"streamed once"]  # never a second, empty PUT
    assert app.bodies["/bytes/aiohttp"] == [b"in memory", b"in memory"]


async def test_a_cancelled_retried_request_leaves_the_pool_usable(server):
    url, app = server
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1))
    transport = AsyncResilientTransport(inner, retry=Retrying(Schedule.fixed(5.0).attempts(2), label="slow-retry"))
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=2.0) as client:
        task = asyncio.create_task(client.get("/cancel/first"))
        while "/cancel/first" not in app.bodies:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the first attempt failed: the retry sleeps
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        r = await client.post("/cancel/second")  # the pool's one connection was given back
        assert r.status_code == 503 and r.text == "hit 1"  # (a POST: one attempt)


def test_an_httpx_multipart_body_is_still_retried_whole(server, tmp_path):
    url, app = server
    path = tmp_path / "part"
    path.write_bytes(b"part content")
    with httpx.Client(base_url=url, transport=ResilientTransport(retry=retry())) as client, path.open("rb") as f:
        r = client.put("/multipart/httpx", files={"f": f})
        assert r.status_code == 200
    first, second = app.bodies["/multipart/httpx"]
    assert first == second and b"part content" in first


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("9" * 400, 300.0),  # a float() of the int overflowed (OverflowError)
        ("9" * 5000, 300.0),  # int() refuses over 4,300 digits (ValueError)
        ("\u00b2", None),  # latin-1 superscript two: isdigit() but not an int (ValueError)
        ("\u0663", None),  # a non-ASCII digit is not delay-seconds
    ],
)
def test_parse_retry_after_never_raises_on_a_hostile_header(value, expected):
    assert parse_retry_after(value) == expected


def test_parse_retry_after_reads_all_three_http_date_forms():
    now = 784111777.0  # Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110 5.6.7: a recipient MUST accept all three)
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now=now) == 10.0
    assert parse_retry_after("Sunday, 06-Nov-94 08:49:47 GMT", now=now) == 10.0
    assert parse_retry_after("Sun Nov  6 08:49:47 1994", now=now) == 10.0  # asctime: GMT by definition


async def test_a_hostile_retry_after_is_still_the_servers_503(server):
    url, _ = server
    seen: list[httpx.Response] = []

    class Hostile(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            response = httpx.Response(503, headers=[(b"retry-after", b"\xb2")], content=b"busy", request=request)
            seen.append(response)
            return response

    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(Hostile())) as client:
        r = await client.get("/anything")
    assert r.status_code == 503 and r.text == "busy" and seen == [r]


async def test_requests_waiting_out_a_retry_after_hold_no_connection_a_healthy_request_needs(server):
    url, app = server
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=2))
    transport = AsyncResilientTransport(inner, retry=retry())
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=httpx.Timeout(5.0, pool=0.5)) as client:
        backing_off = [asyncio.create_task(client.get(f"/after/{n}?retry_after=30")) for n in range(2)]
        while len([p for p in app.bodies if p.startswith("/after/")]) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # both got their 503 and sleep out its Retry-After (30 s)
        r = await client.get("/healthy/async")  # not PoolTimeout: the pool's two connections are free
        assert r.status_code == 200
        for task in backing_off:
            task.cancel()
        await asyncio.gather(*backing_off, return_exceptions=True)


def test_blocking_requests_waiting_out_a_retry_after_hold_no_connection(server):
    import threading

    url, app = server
    inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=1))
    transport = ResilientTransport(inner, retry=retry())
    with httpx.Client(base_url=url, transport=transport, timeout=httpx.Timeout(5.0, pool=0.2)) as client:
        finals: list[httpx.Response] = []
        backing_off = threading.Thread(target=lambda: finals.append(client.get("/after/sync?retry_after=2")))
        backing_off.start()
        while "/after/sync" not in app.bodies:
            threading.Event().wait(0.01)
        threading.Event().wait(0.05)
        assert client.get("/healthy/sync").status_code == 200
        backing_off.join()
    assert finals[0].status_code == 200


async def test_the_last_failed_response_is_returned_readable(server):
    url, _ = server
    transport = AsyncResilientTransport(retry=Retrying(Schedule.fixed(0.01).attempts(1), label="one-try"))
    async with httpx.AsyncClient(base_url=url, transport=transport) as client, \
            client.stream("GET", "/readable/async") as r:  # one attempt: its failure is the answer
        assert r.status_code == 503
        assert b"".join([chunk async for chunk in r.aiter_bytes()]) == b"hit 1"


async def test_an_is_failure_that_raises_is_reported_once_and_the_default_rule_decides(server, caplog):
    url, _ = server

    def is_failure(status: int) -> bool:
        return {500: True, 503: True}[status]  # a user's table that forgot 200

    transport = AsyncResilientTransport(is_failure=is_failure)
    with pytest.warns(RuntimeWarning, match="is_failure"):
        async with httpx.AsyncClient(base_url=url, transport=transport) as client:
            first = await client.get("/healthy/callback")
            second = await client.get("/healthy/callback")
    assert first.status_code == second.status_code == 200  # the response, not KeyError
    assert len([r for r in caplog.records if "is_failure" in r.getMessage()]) == 1


def test_load_shedding_refuses_header_names_that_are_not_names():
    from stoic import Bulkhead
    from stoic.asgi import LoadShedding

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    bulkhead = Bulkhead(1, label="ingress")
    with pytest.raises(TypeError, match="criticality_header"):
        LoadShedding(app, bulkhead=bulkhead, criticality_header=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="deadline_header"):
        LoadShedding(app, bulkhead=bulkhead, deadline_header=b"x-timeout")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="deadline_header"):
        LoadShedding(app, bulkhead=bulkhead, deadline_header="")
    LoadShedding(app, bulkhead=bulkhead, criticality_header=None, deadline_header="X-Request-Timeout")


class FakeResponse:
    def __init__(self, status: int) -> None:
        self.status = status


async def test_a_response_that_fails_to_close_never_replaces_the_result_or_the_error():
    from stoic import RetryBudget
    from stoic._http import HTTPPolicies

    policies: HTTPPolicies[FakeResponse] = HTTPPolicies(
        retry=Retrying(Schedule.fixed(0.0).attempts(3), label="r", budget=RetryBudget.UNLIMITED))

    def close(response: FakeResponse) -> None:
        raise OSError("the socket was already gone")

    for last, expected in ((200, None), (ConnectionResetError, ConnectionResetError)):
        made: list[FakeResponse] = []
        statuses: list[Any] = [503, last, last]

        async def attempt(statuses: list[Any] = statuses, made: list[FakeResponse] = made) -> FakeResponse:
            status = statuses.pop(0)
            if not isinstance(status, int):
                raise status("the transport failed")
            response = FakeResponse(status)
            made.append(response)
            return policies.check(response, status, {}, "k")

        if expected is None:
            assert (await policies.run("k", "GET", attempt, made, close)).status == 200
            assert policies.run_sync("k", "GET", lambda: policies.check(FakeResponse(200), 200, {}, "k"),
                                     [FakeResponse(503)], close).status == 200
        else:
            with pytest.raises(expected):  # the transport's error, not the OSError of a close
                await policies.run("k", "GET", attempt, made, close)


def test_retry_methods_and_is_failure_of_the_wrong_type_are_refused_at_construction():
    with pytest.raises(TypeError, match="retry_methods"):
        AsyncResilientTransport(retry=retry(), retry_methods="GET")  # its letters: nothing retried
    with pytest.raises(TypeError, match="retry_methods"):
        ResilientTransport(retry=retry(), retry_methods=["GET", 1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="is_failure"):
        ResilientMiddleware(is_failure=500)  # type: ignore[arg-type]
    AsyncResilientTransport(retry=retry(), retry_methods=("get", "POST"))


async def test_a_hedged_attempt_never_closes_its_rivals_response(clock) -> None:
    from stoic import Hedge, RetryBudget
    from stoic._http import HTTPPolicies

    class Resp:
        def __init__(self, status: int, n: int) -> None:
            self.status, self.n, self.closed = status, n, False

    policies: HTTPPolicies[Resp] = HTTPPolicies(
        hedge=Hedge(1.0, label="hedge"),
        retry=Retrying(Schedule.fixed(0.0).attempts(1), label="r", budget=RetryBudget.UNLIMITED, clock=clock))
    made: list[Resp] = []
    takes = [1.0, 0.5]  # the first answers at the instant the hedge fires: both race

    async def attempt() -> Resp:
        n = 2 - len(takes)
        await clock.sleep(takes.pop(0))
        response = Resp(503, n)
        made.append(response)
        return policies.check(response, 503, {}, "k")

    def close(response: Resp) -> None:
        response.closed = True

    response = await clock.run(policies.run("k", "GET", attempt, made, close))
    assert response.status == 503 and not response.closed  # the answer the caller gets is open
    assert len(made) == 2 and all(r.closed for r in made if r is not response)


def test_a_retried_request_gives_its_connection_back_before_it_queues_in_a_bulkhead(server):
    import threading

    from stoic import BlockingBulkhead

    url, app = server
    inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=1))
    transport = ResilientTransport(inner, stages=[BlockingBulkhead(1, queue_limit=10, label="one")],
                                   retry=Retrying(Schedule.fixed(0.3).attempts(2), label="slow-retry"))
    results: dict[str, Any] = {}
    with httpx.Client(base_url=url, transport=transport, timeout=httpx.Timeout(5.0, pool=2.0)) as client:
        def get(name: str, path: str) -> None:
            try:  # (the second is a POST: one attempt, a PoolTimeout is not retried away)
                results[name] = client.request("GET" if name == "first" else "POST", path).status_code
            except httpx.HTTPError as exc:
                results[name] = type(exc).__name__

        first = threading.Thread(target=get, args=("first", "/chunked/bulkhead-sync"))
        first.start()
        while "/chunked/bulkhead-sync" not in app.bodies:
            threading.Event().wait(0.01)
        threading.Event().wait(0.05)  # its 503 is held (chunked: not read) while its retry sleeps
        second = threading.Thread(target=get, args=("second", "/healthy/bulkhead-sync"))
        second.start()  # takes the slot, then waits for the pool's one connection
        first.join(10)
        second.join(10)
    # The first, back from its sleep, must not queue for the slot while holding the connection
    # the slot's holder waits for (both would wait until the pool timeout).
    assert results == {"first": 200, "second": 200}


async def test_an_asyncio_retried_request_gives_its_connection_back_before_it_queues_in_a_bulkhead(server):
    from stoic import Bulkhead

    url, app = server
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1))
    transport = AsyncResilientTransport(inner, stages=[Bulkhead(1, queue_limit=10, label="one")],
                                        retry=Retrying(Schedule.fixed(0.3).attempts(2), label="slow-retry"))
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=httpx.Timeout(5.0, pool=2.0)) as client:
        first = asyncio.create_task(client.get("/chunked/bulkhead-async"))
        while "/chunked/bulkhead-async" not in app.bodies:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        second = asyncio.create_task(client.post("/healthy/bulkhead-async"))  # one attempt
        results = await asyncio.gather(first, second, return_exceptions=True)
    assert [getattr(r, "status_code", type(r).__name__) for r in results] == [200, 200]
