"""The aiohttp client middleware against a real server (uvicorn on loopback): the same rules
as the httpx transport (stoic._http), through aiohttp's ClientSession(middlewares=...)."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from _scripted_app import ScriptedApp
from _uvicorn import serving

import stoic
from stoic import CircuitBreaker, CircuitOpen, CountWindow, Hedge, Keyed, Retrying, Schedule
from stoic.aiohttp import ResilientMiddleware, by_route
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


def session(url: str, middleware: ResilientMiddleware) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(base_url=url, middlewares=(middleware,))


async def test_a_5xx_opens_the_hosts_breaker_and_is_still_a_response(server):
    url, _ = server
    family = breakers()
    async with session(url, ResilientMiddleware(stages=[family])) as http:
        async with http.get("/status/500") as r:
            assert r.status == 500 and await r.text() == "status 500"
        async with http.get("/status/503") as r:
            assert r.status == 503
        with pytest.raises(CircuitOpen) as refused:
            await http.get("/ok")
    assert refused.value.label == "hosts:" + url.removeprefix("http://")


async def test_retries_idempotent_requests_only_and_releases_failed_attempts(server):
    url, app = server
    retry = Retrying(Schedule.fixed(0.01).attempts(4), label="http-retry")
    middleware = ResilientMiddleware(stages=[breakers(window=CountWindow(20), minimum_calls=10)], retry=retry)
    seen: list[aiohttp.ClientResponse] = []

    async def record(request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
        response = await handler(request)
        seen.append(response)
        return response

    async with aiohttp.ClientSession(base_url=url, middlewares=(middleware, record)) as http:
        async with http.get("/flaky/a1?fail=2") as r:
            assert r.status == 200 and await r.text() == "ok"
        assert app.hits["a1"] == 3
        assert [x.status for x in seen] == [503, 503, 200] and seen[0].closed and seen[1].closed
        async with http.post("/flaky/a2?fail=1", data=b"x") as r:
            assert r.status == 503
        assert app.hits["a2"] == 1
        async with http.get("/flaky/a3?fail=9&code=502") as r:
            assert r.status == 502 and await r.text() == "failing"  # the last attempt's response
        assert app.hits["a3"] == 4
    middleware = ResilientMiddleware(retry=retry, retry_methods={"GET", "POST"})
    async with session(url, middleware) as http, http.post("/flaky/a4?fail=1", data=b"x") as r:
        assert r.status == 200 and app.hits["a4"] == 2


async def test_retry_after_is_honoured_clamped_and_ignored_when_malformed(server):
    url, _ = server
    sink = RecordingSink()
    middleware = ResilientMiddleware(
        retry=Retrying(Schedule.fixed(0.01).attempts(2), label="http-retry"), retry_after_cap=0.05
    )
    past = email.utils.formatdate(time.time() - 3600, usegmt=True)
    with stoic.use_sinks(sink):
        async with session(url, middleware) as http:
            for path, params in [
                ("/flaky/b1", {"fail": "1", "retry_after": "120"}),
                ("/flaky/b2", {"fail": "1", "code": "429", "retry_after": "later"}),
                ("/flaky/b3", {"fail": "1", "retry_after": past}),
            ]:
                async with http.get(path, params=params) as r:
                    assert r.status == 200
    sink.assert_contract()
    assert [(e.attributes["decision"], e.attributes["next_delay"]) for e in sink.of("retry.attempt_failed")] == [
        ("retry_after", 0.05),
        ("retry", 0.01),
        ("retry", 0.01),  # an elapsed date: retry now, on the schedule (field report 19)
    ]


async def test_429_never_opens_the_breaker_and_connection_errors_do(server):
    url, _ = server
    family = breakers()
    async with session(url, ResilientMiddleware(stages=[family])) as http:
        for _ in range(5):
            async with http.get("/status/429") as r:
                assert r.status == 429
    assert str(family.get(url.removeprefix("http://")).state) == "closed"
    with serving(ScriptedApp()) as gone:
        pass
    async with aiohttp.ClientSession(middlewares=(ResilientMiddleware(stages=[family]),)) as http:
        for _ in range(2):
            with pytest.raises(aiohttp.ClientConnectionError):
                await http.get(f"{gone}/ok")
        with pytest.raises(CircuitOpen):
            await http.get(f"{gone}/ok")
        with pytest.raises(TimeoutError):  # aiohttp's timeouts are TimeoutErrors
            await http.get(f"{url}/sleep?seconds=0.5", timeout=aiohttp.ClientTimeout(total=0.05))


async def test_keys_by_route_template(server):
    url, _ = server
    family = breakers()
    middleware = ResilientMiddleware(stages=[family], key=by_route("/status/{code}"))
    async with session(url, middleware) as http:
        for path in ("/status/500", "/status/502", "/ok"):
            async with http.get(path):
                pass
    host = url.removeprefix("http://")
    assert set(family) == {f"{host} GET /status/{{code}}", f"{host} GET *"}


async def test_a_hedge_races_a_slow_get_but_never_a_post(server):
    url, app = server
    async with session(url, ResilientMiddleware(hedge=Hedge(0.05, label="hedge"))) as http:
        started = time.monotonic()
        async with http.get("/slow/ah1?first=2") as r:
            assert await r.text() == "hit 2"
        assert time.monotonic() - started < 1.5 and app.hits["ah1"] == 2
        async with http.post("/slow/ah2?first=0.2", data=b"x") as r:
            assert await r.text() == "hit 1" and app.hits["ah2"] == 1
    middleware = ResilientMiddleware(hedge=Hedge(0.05, label="hedge"), retry_methods={"GET", "POST"})
    async with session(url, middleware) as http, http.post("/slow/ah3?first=2", json={"a": 1}) as r:
        assert await r.text() == "hit 2" and app.hits["ah3"] == 2  # the caller said POST may be repeated


async def test_a_body_two_attempts_cannot_send_at_once_is_not_hedged(server):
    url, app = server

    async def body() -> AsyncIterator[bytes]:
        yield b"streamed "
        yield b"once"

    async with session(url, ResilientMiddleware(hedge=Hedge(0.05, label="hedge"))) as http:
        async with http.put("/slow/ah4?first=0.3", data=body()) as r:
            assert await r.text() == "hit 1"
        assert app.hits["ah4"] == 1
        async with http.put("/slow/ah5?first=2", data="in memory") as r:
            assert await r.text() == "hit 2"


async def test_a_hedges_losing_response_is_released(server):
    url, _ = server
    seen: list[aiohttp.ClientResponse] = []
    both = asyncio.Event()

    async def hold(request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
        # Both attempts get their response, then finish in the same loop iteration: the hedge
        # has a winner and a finished loser whose response the middleware must release.
        response = await handler(request)
        seen.append(response)
        if len(seen) == 2:
            both.set()
        await both.wait()
        return response

    middleware = ResilientMiddleware(hedge=Hedge(0.05, label="hedge"))
    http = aiohttp.ClientSession(base_url=url, middlewares=(middleware, hold))
    async with http, http.get("/drip?seconds=0.3") as r:  # headers at once, the body later
        assert len(seen) == 2 and r in seen
        assert [x.closed for x in seen if x is not r] == [True]
        assert await r.text() == "ok"


async def test_a_hedged_request_still_times_out_as_a_whole(server):
    url, app = server
    before = app.hits["sleep"]
    async with session(url, ResilientMiddleware(hedge=Hedge(0.05, label="hedge"))) as http:
        started = time.monotonic()
        with pytest.raises(TimeoutError):  # aiohttp's total timeout covers every attempt
            await http.get("/sleep?seconds=1", timeout=aiohttp.ClientTimeout(total=0.4))
        assert time.monotonic() - started < 0.9 and app.hits["sleep"] - before == 2
        async with http.get("/ok") as r:  # the session is still usable
            assert r.status == 200


def test_a_hedge_must_be_a_hedge():
    with pytest.raises(TypeError, match="hedge"):
        ResilientMiddleware(hedge=object())  # type: ignore[arg-type]


def test_a_blocking_stage_is_refused_at_construction():
    # A BlockingBulkhead has no execute(): the middleware used to build, then fail every request.
    with pytest.raises(TypeError, match="execute"):
        ResilientMiddleware(stages=[stoic.BlockingBulkhead(2, label="bb")])
    with pytest.raises(TypeError, match="execute"):
        ResilientMiddleware(stages=[Keyed(stoic.BlockingRateLimiter, label="kr", rate=5)])
    ResilientMiddleware(stages=[Keyed(CircuitBreaker, label="kc"), stoic.Bulkhead(2, label="b")])


@pytest.mark.parametrize("url", ["http://Example.COM/a", "http://example.com:80/a", "https://example.com:443/",
                                 "https://example.com:8443/", "http://[::1]:8080/", "http://[::1]/",
                                 "http://bücher.de/", "http://127.0.0.1:80/", "http://127.0.0.1:8080/"])
async def test_by_host_keys_a_host_as_the_httpx_transport_does(url: str):
    # One dependency, one key: "http://h:80/" was "h:80" beside "h" (two breakers for one
    # host), and an IPv6 literal "::1:8080" (ambiguous) where httpx says "[::1]:8080".
    import httpx
    import yarl

    from stoic.aiohttp import by_host
    from stoic.httpx import by_host as httpx_by_host

    request = aiohttp.ClientRequest("GET", yarl.URL(url), loop=asyncio.get_running_loop())
    assert by_host(request) == httpx_by_host(httpx.Request("GET", url))


async def test_the_sessions_total_timeout_bounds_the_retries_and_a_stoic_timeout_returns_the_last_response(server):
    """docs/aiohttp.md: aiohttp's ``total`` covers the middleware, so a retry course longer than
    it ends in aiohttp's TimeoutError; under ``stoic.timeout`` the retry starts no backoff that
    would end past the deadline and the caller gets the last 503. (aiohttp's timer is real
    time: the delays are short, the assertions leave room for a loaded machine.)"""
    url, app = server
    retry = Retrying(Schedule.fixed(0.1).attempts(4), label="total-retry")
    short_total = aiohttp.ClientTimeout(total=0.15)
    async with aiohttp.ClientSession(base_url=url, middlewares=(ResilientMiddleware(retry=retry),),
                                     timeout=short_total) as http:
        with pytest.raises(TimeoutError):
            async with http.get("/flaky/t1?fail=9"):
                pass
    patient = aiohttp.ClientTimeout(total=None, sock_read=5.0)
    async with (aiohttp.ClientSession(base_url=url, middlewares=(ResilientMiddleware(retry=retry),),
                                      timeout=patient) as http,
                stoic.timeout(0.25), http.get("/flaky/t2?fail=9") as r):
        assert r.status == 503 and await r.text() == "failing"
    assert 2 <= app.hits["t2"] <= 3  # attempts at 0, 0.1 and 0.2 s; the next would start past 0.25 s
