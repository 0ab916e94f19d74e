"""The ASGI load-shedding middleware through a real server (uvicorn on loopback): admitted
requests keep their latency under a load that exceeds the limit while the excess is shed;
429 + Retry-After for a rate limit; criticality and deadline from headers."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx
import pytest
from _uvicorn import serving

import stoic
from stoic import Bulkhead, Criticality, RateLimiter
from stoic.asgi import LoadShedding, parse_criticality

pytestmark = pytest.mark.integration

SERVICE_TIME = 0.2  # seconds per request at the backend
CAPACITY = 4  # requests the backend serves at once


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


async def load(url: str, clients: int, requests_each: int) -> tuple[list[float], list[httpx.Response]]:
    """``clients`` concurrent callers, each making ``requests_each`` requests back to back."""
    admitted: list[float] = []
    refused: list[httpx.Response] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def caller() -> None:
            await client.get("/")  # connect first: the load is what is measured, not the handshakes
            for _ in range(requests_each):
                started = time.perf_counter()
                r = await client.get("/")
                if r.status_code == 200:
                    admitted.append(time.perf_counter() - started)
                else:
                    refused.append(r)
                    await asyncio.sleep(2 * SERVICE_TIME)  # a refused caller backs off (a bounded load)

        await asyncio.gather(*(caller() for _ in range(clients)))
    return admitted, refused


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


async def test_admitted_requests_keep_their_latency_while_the_excess_is_shed():
    with serving(Backend()) as url:  # the same load, unshed: 24 callers queue on 4 slots
        queued, _ = await load(url, clients=24, requests_each=3)
    backend = Backend()
    app = LoadShedding(backend, bulkhead=Bulkhead(CAPACITY, queue_limit=0, label="ingress"))
    with serving(app) as url:
        admitted, refused = await load(url, clients=24, requests_each=3)
    assert len(admitted) + len(refused) == 24 * 3
    assert refused and {r.status_code for r in refused} == {503}
    assert len(admitted) >= 10
    assert backend.most <= CAPACITY
    # Unshed, a request waits behind ~5 others (~1.2 s); shed, an admitted one waits for
    # nobody and its latency stays near the service time. Compared on the same machine, in the
    # same run, so a loaded machine slows both alike.
    assert p99(queued) > 3 * SERVICE_TIME
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
