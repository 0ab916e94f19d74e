"""The httpx transports against a real server (uvicorn on loopback): failures, Retry-After,
idempotency, hedging, keyed breakers, and the bodies of failed attempts closed."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from _scripted_app import ScriptedApp
from _uvicorn import serving

import stoic
from stoic import (
    BlockingBulkhead,
    Bulkhead,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    CountWindow,
    Hedge,
    Keyed,
    Retrying,
    Schedule,
)
from stoic.httpx import AsyncResilientTransport, ResilientTransport, by_host, by_route, parse_retry_after
from stoic.testing import RecordingSink

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, ScriptedApp]]:
    app = ScriptedApp()
    with serving(app) as url:
        yield url, app


def breakers(**kw: object) -> Keyed[CircuitBreaker]:
    config: dict[str, object] = {"window": CountWindow(4), "minimum_calls": 2, **kw}
    return Keyed(CircuitBreaker, label="hosts", **config)


class Recording(httpx.AsyncBaseTransport):
    """The real transport, keeping every response it returned (to check which were closed)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.responses: list[httpx.Response] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        self.responses.append(response)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_5xx_is_a_failure_that_opens_the_hosts_breaker(server):
    url, _ = server
    family = breakers()
    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(stages=[family])) as client:
        r = await client.get("/status/500")
        assert r.status_code == 500 and r.text == "status 500"  # still a response to the caller
        await client.get("/status/502")
        with pytest.raises(CircuitOpen) as refused:
            await client.get("/ok")
    host = url.removeprefix("http://")
    assert refused.value.label == f"hosts:{host}"
    assert list(family) == [host]


async def test_retries_an_idempotent_request_and_closes_the_failed_attempts(server):
    url, app = server
    inner = Recording()
    family = breakers(window=CountWindow(10), minimum_calls=5)
    transport = AsyncResilientTransport(
        inner, stages=[family], retry=Retrying(Schedule.fixed(0.01).attempts(4), label="http-retry")
    )
    async with httpx.AsyncClient(base_url=url, transport=transport) as client:
        r = await client.get("/flaky/get1?fail=2")
    assert r.status_code == 200 and r.text == "ok" and app.hits["get1"] == 3
    assert [x.status_code for x in inner.responses] == [503, 503, 200]
    assert inner.responses[0].is_closed and inner.responses[1].is_closed


async def test_the_last_failed_response_is_returned_when_retries_are_over(server):
    url, app = server
    transport = AsyncResilientTransport(retry=Retrying(Schedule.fixed(0.01).attempts(2), label="http-retry"))
    async with httpx.AsyncClient(base_url=url, transport=transport) as client:
        r = await client.get("/flaky/get2?fail=9&code=502")
    assert r.status_code == 502 and r.text == "failing" and app.hits["get2"] == 2


async def test_a_post_is_not_retried_unless_the_caller_says_so(server):
    url, app = server
    retry = Retrying(Schedule.fixed(0.01).attempts(3), label="http-retry")
    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(retry=retry)) as client:
        r = await client.post("/flaky/post1?fail=1", content=b"x")
    assert r.status_code == 503 and app.hits["post1"] == 1
    transport = AsyncResilientTransport(retry=retry, retry_methods={"GET", "POST"})
    async with httpx.AsyncClient(base_url=url, transport=transport) as client:
        r = await client.post("/flaky/post2?fail=1", content=b"x")
    assert r.status_code == 200 and app.hits["post2"] == 2


async def test_retry_after_replaces_the_schedules_delay_clamped_at_the_cap(server):
    url, _ = server
    sink = RecordingSink()
    retry = Retrying(Schedule.fixed(0.01).attempts(2), label="http-retry")
    transport = AsyncResilientTransport(retry=retry, retry_after_cap=0.05)
    with stoic.use_sinks(sink):
        async with httpx.AsyncClient(base_url=url, transport=transport) as client:
            assert (await client.get("/flaky/ra1?fail=1&retry_after=120")).status_code == 200
            assert (await client.get("/flaky/ra2?fail=1&code=429&retry_after=0.5x")).status_code == 200
            past = email.utils.formatdate(time.time() - 3600, usegmt=True)
            assert (await client.get("/flaky/ra3", params={"fail": "1", "retry_after": past})).status_code == 200
            assert (await client.get("/flaky/ra4?fail=1&code=500&retry_after=3")).status_code == 200
    sink.assert_contract()
    failed = [(e.attributes["decision"], e.attributes["next_delay"]) for e in sink.of("retry.attempt_failed")]
    assert failed == [
        ("retry_after", 0.05),  # 120 s asked, capped at retry_after_cap
        ("retry", 0.01),  # malformed: the schedule's delay, and still a response
        ("retry", 0.01),  # an elapsed date: retry now, on the schedule (field report 19)
        ("retry", 0.01),  # Retry-After is read on 429 and 503 only
    ]


async def test_a_429_is_the_servers_refusal_and_never_opens_the_breaker(server):
    url, _ = server
    family = breakers()
    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(stages=[family])) as client:
        for _ in range(6):
            assert (await client.get("/status/429?retry_after=1")).status_code == 429
    assert str(family.get(url.removeprefix("http://")).state) == "closed"


async def test_connection_errors_and_timeouts_are_failures(server):
    url, _ = server
    family = breakers()
    with serving(ScriptedApp()) as gone:
        pass  # the server has stopped: its port refuses connections
    async with httpx.AsyncClient(transport=AsyncResilientTransport(stages=[family])) as client:
        for _ in range(2):
            with pytest.raises(httpx.ConnectError):
                await client.get(f"{gone}/ok")
        with pytest.raises(CircuitOpen):
            await client.get(f"{gone}/ok")
        for _ in range(2):
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"{url}/sleep?seconds=0.5", timeout=0.05)
        with pytest.raises(CircuitOpen):
            await client.get(f"{url}/ok")


@pytest.mark.parametrize("recipe", [False, True])
async def test_a_pool_timeout_is_a_failure_unless_record_when_leaves_it_out(server, recipe):
    # docs/httpx.md, "What counts as what": the recipe that keeps this client's own pool
    # contention out of the breaker, and the default it changes.
    url, _ = server

    def local_pool_contention_is_not_a_failure(error: Exception) -> bool:
        return not isinstance(error, httpx.PoolTimeout) and CircuitBreaker.counts_by_default(error)

    breaker = CircuitBreaker(label="pool", window=CountWindow(2), minimum_calls=2,
                             record_when=local_pool_contention_is_not_a_failure if recipe
                             else CircuitBreaker.counts_by_default)
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1))
    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(inner, stages=[breaker]),
                                 timeout=httpx.Timeout(5.0, pool=0.05)) as client:
        holder = asyncio.create_task(client.get("/sleep?seconds=0.6"))  # holds the one connection
        await asyncio.sleep(0.1)
        for _ in range(2):
            with pytest.raises(httpx.PoolTimeout):
                await client.get("/ok")
        assert str(breaker.state) == ("closed" if recipe else "open")
        assert (await holder).status_code == 200


async def test_a_hedge_races_a_slow_get_but_never_a_post(server):
    url, app = server
    transport = AsyncResilientTransport(hedge=Hedge(0.05, label="hedge"))
    async with httpx.AsyncClient(base_url=url, transport=transport) as client:
        started = time.monotonic()
        r = await client.get("/slow/h1?first=2")
        assert r.text == "hit 2" and time.monotonic() - started < 1.5 and app.hits["h1"] == 2
        r = await client.post("/slow/h2?first=0.2")
        assert r.text == "hit 1" and app.hits["h2"] == 1


async def test_a_body_two_attempts_cannot_send_at_once_is_not_hedged(server):
    url, app = server

    async def body() -> AsyncIterator[bytes]:
        yield b"streamed "
        yield b"once"

    transport = AsyncResilientTransport(hedge=Hedge(0.05, label="hedge"))
    async with httpx.AsyncClient(base_url=url, transport=transport) as client:
        r = await client.put("/slow/h3?first=0.3", content=body())
        assert r.text == "hit 1" and app.hits["h3"] == 1
        r = await client.put("/slow/h4?first=2", content=b"in memory")
        assert r.text == "hit 2" and app.hits["h4"] == 2


async def test_keys_by_route_template_and_a_keyed_bulkhead(server):
    url, _ = server
    family = breakers()
    key = by_route("/flaky/{name}", "/status/{code}")
    bulkheads = Keyed(Bulkhead, label="bh", max_concurrent=1)
    transport = AsyncResilientTransport(stages=[family, bulkheads], key=key)
    async with httpx.AsyncClient(base_url=url, transport=transport) as client:
        await client.get("/status/500")
        await client.get("/status/503")
        with pytest.raises(CircuitOpen):
            await client.get("/status/200")  # the same template
        assert (await client.get("/ok")).status_code == 200  # another key: unaffected
        slow = asyncio.create_task(client.get("/sleep?seconds=0.3"))
        await asyncio.sleep(0.1)
        with pytest.raises(BulkheadFull):
            await client.get("/sleep?seconds=0")
        assert (await slow).status_code == 200
    host = url.removeprefix("http://")
    assert set(family) == {f"{host} GET /status/{{code}}", f"{host} GET *"}


def test_the_blocking_transport_follows_the_same_rules(server):
    url, app = server
    family = Keyed(CircuitBreaker, label="hosts", window=CountWindow(10), minimum_calls=5)
    retry = Retrying(Schedule.fixed(0.01).attempts(3), label="http-retry")
    transport = ResilientTransport(stages=[family, Keyed(BlockingBulkhead, label="b", max_concurrent=2)], retry=retry)
    with httpx.Client(base_url=url, transport=transport) as client:
        r = client.get("/flaky/sync1?fail=2")
        assert r.status_code == 200 and app.hits["sync1"] == 3
        assert client.post("/flaky/sync2?fail=1").status_code == 503 and app.hits["sync2"] == 1
        client.post("/status/500")  # the fifth call, the fourth failure: the breaker opens
        with pytest.raises(CircuitOpen):
            client.post("/ok")  # not retried (a GET would wait out the open period, then probe)
    with pytest.raises(TypeError, match="asynchronous"):
        ResilientTransport(hedge=Hedge(0.1, label="h"))  # type: ignore[call-arg]
    # No hedge at all is not a hedge: the same keyword arguments build either transport.
    shared = {"retry": None, "hedge": None, "stages": ()}
    assert isinstance(ResilientTransport(**shared), ResilientTransport)
    assert isinstance(AsyncResilientTransport(**shared), AsyncResilientTransport)
    with pytest.raises(TypeError, match="unexpected"):
        ResilientTransport(hedge=None, hedges=1)  # type: ignore[call-arg]


def test_the_blocking_transport_with_one_breaker_and_no_retry(server):
    url, _ = server
    family = breakers()
    seen: list[httpx.Response] = []

    class Keeping(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            seen.append(response)
            return response

    transport = ResilientTransport(Keeping(), stages=[family])
    with httpx.Client(base_url=url, transport=transport) as client:
        assert client.get("/ok").text == "ok"
        for _ in range(3):
            assert client.get("/status/429").status_code == 429  # the server's refusal: not counted
        assert str(family.get(url.removeprefix("http://")).state) == "closed"
        r = client.get("/status/502")
        assert r.status_code == 502 and r.text == "status 502"  # a failure (the breaker opens), still the response
        with pytest.raises(CircuitOpen):
            client.get("/ok")
    assert len(seen) == 5  # one attempt per request: no retry


def test_configuration_errors():
    with pytest.raises(TypeError, match="stage"):
        AsyncResilientTransport(stages=[object()])
    with pytest.raises(ValueError, match="retry_after_cap"):
        AsyncResilientTransport(retry_after_cap=-1)
    request = httpx.Request("GET", "http://example.com:8080/users/42")
    assert by_host(request) == "example.com:8080"
    assert by_route("/users/{id}")(request) == "example.com:8080 GET /users/{id}"


def test_a_stage_of_the_other_kind_of_client_is_refused_at_construction(server):
    # An asyncio Bulkhead has no call() and a BlockingBulkhead no execute(): such a transport
    # used to build, then fail every request with an AttributeError.
    for stages in ([Bulkhead(2, label="b")], [Keyed(Bulkhead, label="kb", max_concurrent=2)],
                   [CircuitBreaker(label="c"), stoic.RateLimiter(5, label="r")]):
        with pytest.raises(TypeError, match="call"):
            ResilientTransport(stages=stages)
    for stages in ([BlockingBulkhead(2, label="bb")], [Keyed(BlockingBulkhead, label="kbb", max_concurrent=2)],
                   [stoic.BlockingRateLimiter(5, label="br")]):
        with pytest.raises(TypeError, match="execute"):
            AsyncResilientTransport(stages=stages)
    # A family built by a factory function is told by a policy the factory builds.
    with pytest.raises(TypeError, match="execute"):
        AsyncResilientTransport(stages=[Keyed(lambda **config: BlockingBulkhead(2, **config), label="f0")])
    # What each kind of client runs is still taken (a breaker has both).
    ResilientTransport(stages=[CircuitBreaker(label="c2"), Keyed(BlockingBulkhead, label="kbb2", max_concurrent=2),
                               Keyed(lambda **config: BlockingBulkhead(2, **config), label="f")])
    AsyncResilientTransport(stages=[CircuitBreaker(label="c3"), Keyed(Bulkhead, label="kb2", max_concurrent=2)])
    url, _app = server
    with httpx.Client(base_url=url, transport=ResilientTransport(stages=[BlockingBulkhead(1, label="bb2")])) as client:
        assert client.get("/ok").status_code == 200


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3", 3.0),
        (" 0 ", 0.0),
        ("1000", 300.0),
        (None, None),
        ("", None),
        ("-1", None),
        ("1.5", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
        ("Wed, 99 Oct 2015 07:28:00 GMT", None),
        ("Wed, 21 Oct 2015 07:28:00", None),
    ],
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value) == expected


def test_parse_retry_after_reads_a_future_date_from_now():
    now = 1_700_000_000.0
    future = email.utils.formatdate(now + 42, usegmt=True)
    assert parse_retry_after(future, now=now) == 42.0
    assert parse_retry_after(future, now=now, cap=10) == 10.0
