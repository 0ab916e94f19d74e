"""The seed's HTTP-client stack end to end on virtual time (seed 000, "API" and "Testing"):

    Pipeline(Retrying(exponential(0.2).jittered().attempts(3)), CircuitBreaker, RateLimiter, Bulkhead)

with the whole call under stoic.timeout(10) and each attempt under stoic.timeout(2).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import stoic
from stoic import CircuitOpen, DeadlineExceeded, Pipeline, Retrying, Schedule, with_fallback
from stoic.testing import RecordingSink, VirtualClock

LABEL = "api.example.com"


class Server:
    """A fake HTTP dependency: each request takes ``latency``; ``mode`` decides the outcome."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.mode = "ok"
        self.calls = 0
        self.active = 0
        self.peak = 0
        self.fail_next = 0
        self.hang_next = 0
        self.latency_ns = 50_000_000

    async def send(self, path: str) -> str:
        self.calls += 1
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            if self.hang_next:
                self.hang_next -= 1
                await asyncio.get_running_loop().create_future()
            await self.clock.sleep_until(self.clock.now_ns() + self.latency_ns)
            if self.fail_next:
                self.fail_next -= 1
                raise ConnectionError("reset by peer")
            if self.mode == "down":
                raise ConnectionError("connection refused")
            return f"200 {path}"
        finally:
            self.active -= 1


def build() -> Any:
    return Pipeline(
        Retrying(Schedule.exponential(0.2).jittered().attempts(3), label="op"),
        stoic.CircuitBreaker(label=LABEL),
        stoic.RateLimiter(50, per=1.0, burst=100, label=LABEL),
        stoic.Bulkhead(8, queue_limit=16, label=LABEL),
    )


def client(pipeline: Any, server: Server) -> Any:
    async def send(path: str) -> str:
        async with stoic.timeout(2):  # each attempt
            return await server.send(path)

    async def fetch(path: str) -> str:
        if path == "/with-fallback":
            async with stoic.timeout(10):
                return await with_fallback(pipeline, send, path, fallback=lambda error: "cached", label="fallback")
        async with stoic.timeout(10):  # the whole call, retries included
            result: str = await pipeline.execute(send, path)
            return result

    return fetch


async def test_healthy_traffic_passes_within_the_bulkhead_and_limiter(clock: VirtualClock,
                                                                     sink: RecordingSink) -> None:
    server = Server(clock)
    fetch = client(build(), server)

    async def burst() -> list[str]:
        return await asyncio.gather(*(fetch(f"/item/{i}") for i in range(20)))

    results = await clock.run(burst())
    assert results == [f"200 /item/{i}" for i in range(20)]
    assert server.calls == 20
    assert server.peak <= 8  # the bulkhead
    assert clock.now() == pytest.approx(0.15)  # 20 calls, 8 at a time, 50 ms each
    assert not sink.of("retry.attempt_failed")


async def test_a_transient_failure_and_a_hung_attempt_are_retried(clock: VirtualClock, sink: RecordingSink) -> None:
    server = Server(clock)
    pipeline = build()
    fetch = client(pipeline, server)
    server.fail_next = 1
    assert await clock.run(fetch("/a")) == "200 /a"
    assert server.calls == 2
    server.hang_next = 1
    start = clock.now()
    assert await clock.run(fetch("/b")) == "200 /b"
    assert server.calls == 4
    assert 2.05 <= clock.now() - start <= 2.25  # the 2 s attempt timeout, a jittered 0.2 s wait, 50 ms
    failed = sink.of("retry.attempt_failed")
    assert [e.attributes["error.type"] for e in failed] == ["ConnectionError", "DeadlineExceeded"]
    assert pipeline.stages[1].state == "closed"


async def test_an_outage_opens_the_breaker_and_the_open_breaker_stops_the_retries(
        clock: VirtualClock, sink: RecordingSink) -> None:
    server = Server(clock)
    pipeline = build()
    breaker = pipeline.stages[1]
    fetch = client(pipeline, server)
    server.mode = "down"
    errors: list[Exception] = []
    for i in range(8):
        try:
            await clock.run(fetch(f"/{i}"))
        except Exception as error:
            errors.append(error)
    # Ten recorded failures (minimum_calls) open the breaker; after that nothing reaches the server.
    assert server.calls == 10
    assert breaker.state == "open"
    assert len(sink.of("breaker.opened")) == 1
    # Errors are flat: the operation's own ConnectionError, then the breaker's CircuitOpen.
    assert all(type(e) in (ConnectionError, CircuitOpen) for e in errors)
    assert isinstance(errors[-1], CircuitOpen)
    assert errors[-1].retry_after is not None and errors[-1].retry_after > 10
    # An open breaker's retry_after (about 30 s) cannot fit in the 10 s call: skipped, not slept.
    assert any(e.attributes["error.type"] == "CircuitOpen" for e in sink.of("retry.deadline_skip"))
    assert not any(isinstance(e, DeadlineExceeded) for e in errors)
    # A fallback at the call site turns the outage into a cached answer.
    assert await clock.run(fetch("/with-fallback")) == "cached"
    assert server.calls == 10
    # Once the open period is over and the server is back, a probe closes the breaker.
    server.mode = "ok"
    await clock.advance(301)
    assert await clock.run(fetch("/back")) == "200 /back"
    assert breaker.state == "closed"
