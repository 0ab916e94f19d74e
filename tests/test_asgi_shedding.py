"""The ASGI load-shedding middleware through a real server (uvicorn on loopback): admitted
requests keep their latency under a load that exceeds the limit while the excess is shed;
429 + Retry-After for a rate limit; criticality and deadline from headers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _shed_app import CAPACITY, SERVICE_TIME
from _uvicorn import serving

import stoic
from stoic import Bulkhead, Criticality, RateLimiter
from stoic.asgi import LoadShedding, parse_criticality

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent


class Backend:
    """An app with a fixed capacity: requests past it queue (as a real backend's would)."""

    def __init__(self) -> None:
        self.capacity = asyncio.Semaphore(CAPACITY)
        self.most = 0
        self.inside = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async with self.capacity:
            self.inside += 1
            self.most = max(self.most, self.inside)
            try:
                await asyncio.sleep(SERVICE_TIME)
            finally:
                self.inside -= 1
        body = f"{stoic.current_criticality()} {stoic.time_remaining()}".encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})


async def load(url: str, rate: float, seconds: float) -> tuple[list[float], list[httpx.Response]]:
    """An open-loop load generator: a request every ``1 / rate`` seconds for ``seconds`` (so at
    most ``rate * seconds`` requests: bounded), each timed from its own start."""
    admitted: list[float] = []
    refused: list[httpx.Response] = []
    count = round(rate * seconds)
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one(at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            started = time.perf_counter()
            r = await client.get("/")
            if r.status_code == 200:
                admitted.append(time.perf_counter() - started)
            else:
                refused.append(r)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(t0 + i / rate) for i in range(count)))
    return admitted, refused


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


@contextlib.contextmanager
def serving_apart(app: str) -> Iterator[str]:
    """uvicorn serving ``tests/_shed_app.py``'s ``app`` in its own process, on a free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", f"_shed_app:{app}", "--app-dir", str(HERE),
                             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                             "--no-access-log", "--lifespan", "off"])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("uvicorn did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_admitted_requests_keep_their_latency_while_the_excess_is_shed():
    # 40 requests a second for 2 s at a backend that serves 20 a second (4 at once, 0.2 s each).
    with serving_apart("queued") as url:  # unshed: the backlog grows by 20 a second
        queued, _ = await load(url, rate=40, seconds=2)
    with serving_apart("shed") as url:
        admitted, refused = await load(url, rate=40, seconds=2)
        async with httpx.AsyncClient() as client:
            most = int((await client.get(f"{url}/most")).text)
    assert len(queued) == 80 and len(admitted) + len(refused) == 80
    assert refused and {r.status_code for r in refused} == {503}
    assert len(admitted) >= 10
    assert most <= CAPACITY
    # Unshed, the last requests wait behind ~40 others (~2 s); shed, an admitted one waits for
    # nobody and its latency stays near the service time. Compared on the same machine, in the
    # same run, so a loaded machine slows both alike.
    assert p99(queued) > 5 * SERVICE_TIME
    assert p99(admitted) < p99(queued) / 2, (p99(admitted), p99(queued))


async def test_a_rate_limit_answers_429_with_retry_after():
    limiter = RateLimiter(2, per=10.0, queue_limit=0, label="ingress-rate")
    app = LoadShedding(Backend(), bulkhead=Bulkhead(CAPACITY, label="ingress"), limiter=limiter)
    with serving(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            answers = [await client.get("/") for _ in range(4)]
    assert [r.status_code for r in answers] == [200, 200, 429, 429]
    assert 1 <= int(answers[2].headers["retry-after"]) <= 10
    assert answers[2].text == "rate limited"


async def test_criticality_and_the_deadline_come_from_headers():
    app = LoadShedding(Backend(), bulkhead=Bulkhead(CAPACITY, queue_limit=None, label="ingress"),
                       criticality_header="X-Tier", deadline_header="X-Request-Timeout")
    with serving(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            r = await client.get("/", headers={"x-tier": "CRITICAL", "x-request-timeout": "5"})
            tier, remaining = r.text.split()
            assert r.status_code == 200 and tier == "critical" and 4.0 < float(remaining) <= 5.0
            r = await client.get("/", headers={"x-tier": "vip", "x-request-timeout": "soon"})
            assert r.text.split() == ["normal", "None"]  # unknown tier NORMAL; bad deadline ignored
            r = await client.get("/", headers={"x-request-timeout": "0.02"})
            assert r.status_code == 504 and "retry-after" not in r.headers
            r = await client.get("/", headers={"x-request-timeout": "-1"})
            assert r.status_code == 504


def test_parse_criticality_and_configuration():
    assert parse_criticality(b"best-effort") is Criticality.BEST_EFFORT
    assert parse_criticality("Degraded") is Criticality.DEGRADED
    assert parse_criticality(None) is Criticality.NORMAL and parse_criticality(b"3") is Criticality.NORMAL
    with pytest.raises(TypeError, match="bulkhead"):
        LoadShedding(Backend(), bulkhead=object())
    with pytest.raises(TypeError, match="limiter"):
        LoadShedding(Backend(), bulkhead=Bulkhead(1, label="b"), limiter=object())


def test_a_policy_that_would_fail_every_request_is_refused_at_construction() -> None:
    # Each was accepted and made every request a 500: a Hedge or a Keyed family as the bulkhead
    # ("missing 1 required positional argument: 'fn'"), a BlockingRateLimiter as the limiter
    # (its acquire blocks the event loop, then "NoneType can't be used in 'await' expression").
    for wrong in (stoic.Hedge(0.1, label="h"), stoic.Keyed(Bulkhead, label="k", max_concurrent=2)):
        with pytest.raises(TypeError, match="not a Policy"):
            LoadShedding(Backend(), bulkhead=wrong)
    with pytest.raises(TypeError, match="limiter"):
        LoadShedding(Backend(), bulkhead=Bulkhead(1, label="b"), limiter=stoic.BlockingRateLimiter(5, label="l"))
    LoadShedding(Backend(), bulkhead=stoic.Pipeline(Bulkhead(1, label="b")), limiter=RateLimiter(5, label="l"))


async def test_a_deadline_header_longer_than_any_deadline_is_ignored_not_a_server_error():
    # A client's header, whatever it says, never fails the request: stoic.timeout refuses
    # durations over MAX_SECONDS, so such a value is no deadline, as an unparsable one is.
    app = LoadShedding(Backend(), bulkhead=Bulkhead(CAPACITY, label="ingress"), deadline_header="x-request-timeout")
    with serving(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            for value in ("1e20", "1e300", str(10**12 + 1)):
                r = await client.get("/", headers={"x-request-timeout": value})
                assert r.status_code == 200 and r.text.split() == ["normal", "None"], (value, r.status_code)
            r = await client.get("/", headers={"x-request-timeout": str(10**12)})
            assert r.status_code == 200 and float(r.text.split()[1]) > 10**11


async def test_an_application_whose_every_fanned_out_branch_was_refused_is_answered_as_a_refusal():
    # The exception-group rule (docs/design.md): a group all of whose leaves are refusals is a
    # refusal (503 / 429 / 504, the longest Retry-After a leaf gives); one holding any other
    # error is the application's own (uvicorn's 500). The group used to be a 500 either way.
    groups: dict[str, BaseException] = {
        "/open": ExceptionGroup("fan-out", [stoic.CircuitOpen(label="a", retry_after=2.5),
                                            ExceptionGroup("inner", [stoic.BulkheadFull(label="b", retry_after=7.2)]),
                                            stoic.CircuitOpen(label="c")]),
        "/limited": ExceptionGroup("fan-out", [stoic.RateLimited(label="a", retry_after=1.0),
                                               stoic.RateLimited(label="b")]),
        "/late": ExceptionGroup("fan-out", [stoic.DeadlineExceeded(), stoic.DeadlineExceeded()]),
        "/mixed": ExceptionGroup("fan-out", [stoic.CircuitOpen(label="a", retry_after=1.0), ValueError("bug")]),
    }

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise groups[scope["path"]]

    with serving(LoadShedding(app, bulkhead=Bulkhead(CAPACITY, label="ingress"))) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            r = await client.get("/open")
            assert (r.status_code, r.headers.get("retry-after"), r.text) == (503, "8", "overloaded")
            r = await client.get("/limited")
            assert (r.status_code, r.headers.get("retry-after")) == (429, "1")
            r = await client.get("/late")
            assert r.status_code == 504 and "retry-after" not in r.headers
            r = await client.get("/mixed")
            assert r.status_code == 500
