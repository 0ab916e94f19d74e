"""Hostile tests of HTTPPolicies.run (stoic._http), the rules both HTTP integrations share,
in process: the stages' chain form (every stage once per attempt, outermost first, a Keyed
family resolved per key), retry and hedge through it, and every response but the returned one
closed, on success, exhaustion and cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stoic import (
    Bulkhead,
    CircuitBreaker,
    CircuitOpen,
    CountWindow,
    Hedge,
    Keyed,
    RetryBudget,
    Retrying,
    Schedule,
)
from stoic._http import HTTPPolicies
from stoic._retry import in_retry_attempt
from stoic.testing import VirtualClock


class Resp:
    def __init__(self, status: int, n: int) -> None:
        self.status = status
        self.n = n
        self.closed = False


class Server:
    """Answers each attempt with the next scripted status, after ``takes`` virtual seconds."""

    def __init__(self, policies: HTTPPolicies[Resp], statuses: list[int], clock: VirtualClock,
                 takes: list[float] | None = None) -> None:
        self.policies = policies
        self.statuses = statuses
        self.takes = takes or [0.0] * len(statuses)
        self.clock = clock
        self.made: list[Resp] = []
        self.calls = 0
        self.seen: list[tuple[int, bool]] = []
        self.watch: list[Bulkhead] = []

    def attempt(self) -> Any:
        async def one() -> Resp:
            n = self.calls
            self.calls += 1
            self.seen.append((n, in_retry_attempt()))
            for bulkhead in self.watch:
                assert bulkhead.in_use >= 1  # the attempt runs inside every stage
            await self.clock.sleep(self.takes[n])
            response = Resp(self.statuses[n], n)
            self.made.append(response)
            return self.policies.check(response, response.status, {}, "k")
        return one

    async def run(self, method: str = "GET", key: str = "k") -> Resp:
        def close(response: Resp) -> None:
            response.closed = True
        return await self.policies.run(key, method, self.attempt(), self.made, close)


def three() -> Retrying:
    return Retrying(Schedule.fixed(0.1).attempts(3), label="http", budget=RetryBudget.UNLIMITED)


@pytest.mark.parametrize("bulkheads", [1, 2, 3])
async def test_stages_run_once_per_attempt_and_failed_responses_are_closed(clock: VirtualClock,
                                                                          bulkheads: int) -> None:
    # 2, 3 and 4 stages: resolve() has a branch for each of 1, 2 and more resolvers.
    family = Keyed(CircuitBreaker, label="hosts", window=CountWindow(10), minimum_calls=5)
    watched = [Bulkhead(4, label=f"bh{n}") for n in range(bulkheads)]
    policies: HTTPPolicies[Resp] = HTTPPolicies([family, *watched], retry=three())
    server = Server(policies, [500, 503, 200], clock)
    server.watch = watched
    response = await clock.run(server.run())
    assert response.status == 200 and not response.closed
    assert [r.closed for r in server.made] == [True, True, False]
    assert server.calls == 3 and all(bulkhead.in_use == 0 for bulkhead in watched)
    assert list(family) == ["k"]
    assert all(nested for _, nested in server.seen)  # each attempt is a retry attempt


async def test_exhausted_retries_return_the_last_failed_response_open(clock: VirtualClock) -> None:
    policies: HTTPPolicies[Resp] = HTTPPolicies([CircuitBreaker(label="b", minimum_calls=10)], retry=three())
    server = Server(policies, [500, 500, 502], clock)
    response = await clock.run(server.run())
    assert response.status == 502 and response.n == 2 and not response.closed
    assert [r.closed for r in server.made] == [True, True, False]


async def test_no_stage_at_all_with_retry_and_without(clock: VirtualClock) -> None:
    server = Server(HTTPPolicies([], retry=three()), [500, 200], clock)
    assert (await clock.run(server.run())).status == 200 and server.calls == 2
    server = Server(HTTPPolicies([]), [500], clock)
    assert (await clock.run(server.run())).status == 500 and server.calls == 1


async def test_a_post_is_neither_retried_nor_hedged(clock: VirtualClock) -> None:
    hedge = Hedge(0.01, label="h", budget=RetryBudget.UNLIMITED)
    server = Server(HTTPPolicies([Bulkhead(2, label="bh")], retry=three(), hedge=hedge), [500, 200], clock,
                    takes=[1.0, 0.0])
    response = await clock.run(server.run("POST"))
    assert response.status == 500 and server.calls == 1


async def test_retry_and_hedge_through_a_keyed_family_close_every_response_but_the_winner(
        clock: VirtualClock) -> None:
    family = Keyed(Bulkhead, label="per-host", max_concurrent=4)
    hedge = Hedge(0.05, label="h", budget=RetryBudget.UNLIMITED)
    policies: HTTPPolicies[Resp] = HTTPPolicies([family], retry=three(), hedge=hedge)
    # attempt 0 fails fast (retried); attempt 1 is slow, so a hedge (2) starts and wins.
    server = Server(policies, [500, 200, 200], clock, takes=[0.0, 1.0, 0.0])
    response = await clock.run(server.run())
    assert server.calls == 3 and response.n == 2 and not response.closed
    assert all(r.closed for r in server.made if r is not response)
    assert family.get("k").in_use == 0
    assert [nested for _, nested in server.seen] == [True] * 3  # the hedge's task too


async def test_a_cancelled_request_closes_every_response_and_frees_its_slots(clock: VirtualClock) -> None:
    bulkhead = Bulkhead(1, label="one")
    policies: HTTPPolicies[Resp] = HTTPPolicies([bulkhead], retry=three())
    server = Server(policies, [500, 200], clock, takes=[0.0, 60.0])
    task = asyncio.create_task(server.run())
    await clock.advance(1.0)  # the first attempt failed, the second hangs in its slot
    assert bulkhead.in_use == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert bulkhead.in_use == 0
    assert server.made and all(r.closed for r in server.made)


async def test_an_open_keyed_breaker_refuses_only_its_own_key(clock: VirtualClock) -> None:
    family = Keyed(CircuitBreaker, label="hosts", window=CountWindow(2), minimum_calls=2)
    policies: HTTPPolicies[Resp] = HTTPPolicies([family])
    server = Server(policies, [500, 500, 200], clock)
    await server.run(key="a")
    await server.run(key="a")
    with pytest.raises(CircuitOpen):
        await server.run(key="a")
    assert (await server.run(key="b")).status == 200


async def test_a_keyed_breaker_with_failing_calls_in_flight_is_not_evicted_by_new_keys(clock: VirtualClock) -> None:
    family = Keyed(CircuitBreaker, label="hosts", max_keys=1, window=CountWindow(2), minimum_calls=2)
    policies: HTTPPolicies[Resp] = HTTPPolicies([family])

    async def request(key: str, status: int, takes: float) -> Resp:
        async def attempt() -> Resp:
            await clock.sleep(takes)
            response = Resp(status, 0)
            return policies.check(response, status, {}, key)
        return await policies.run(key, "GET", attempt, [], lambda response: None)

    for _ in range(2):
        slow = asyncio.create_task(request("a", 500, 1.0))  # a's failing call is in flight...
        await asyncio.sleep(0)
        await request("b", 200, 0.0)  # ...when b needs room
        await clock.advance(1.0)
        await slow
    assert str(family.get("a").state) == "open"


async def test_a_bulkhead_familys_key_stays_held_through_a_requests_retry_backoff(clock: VirtualClock) -> None:
    # Between attempts the request holds no slot, so the bulkhead counts nothing: the key must
    # still be busy for the family (the retried attempt runs on the key's bulkhead, the one held).
    family = Keyed(Bulkhead, label="per-host", max_keys=1, max_concurrent=1, clock=clock)
    server = Server(HTTPPolicies([family], retry=three()), [500, 200], clock)

    async def scenario() -> None:
        task = asyncio.ensure_future(server.run(key="a"))
        await clock.sleep(0.05)  # the first attempt failed; the retry sleeps 0.1 s
        assert family.get("b").label == "per-host:_other" and "a" in family
        assert (await task).status == 200

    await clock.run(scenario())
    assert family.get("b").label == "per-host:b"  # the request over, "a" could go


def releasing(server: Server, log: list[str]) -> Any:
    """``server.run`` with a drain and a close that log what they did to which response."""
    def drain(response: Resp) -> None:
        log.append(f"drain {response.n}")

    async def close(response: Resp) -> None:
        response.closed = True
        log.append(f"close {response.n}")

    async def run() -> Resp:
        return await server.policies.run("k", "GET", server.attempt(), server.made, close, drain=drain)
    return run()


async def test_a_failed_response_is_drained_and_closed_before_the_backoff_not_after(clock: VirtualClock) -> None:
    log: list[str] = []
    server = Server(HTTPPolicies([Bulkhead(1, label="bh")], retry=three()), [503, 500, 200], clock)
    task = asyncio.ensure_future(releasing(server, log))
    await clock.advance(0.05)  # the first attempt failed; its retry sleeps 0.1 s
    assert log == ["drain 0", "close 0"] and server.calls == 1  # released while the retry sleeps
    await clock.advance(0.1)
    assert log == ["drain 0", "close 0", "drain 1", "close 1"] and server.calls == 2
    await clock.advance(0.1)
    response = await task
    assert response.n == 2 and not response.closed and len(log) == 4  # each released once


async def test_a_failed_response_no_retry_follows_is_neither_drained_nor_closed(clock: VirtualClock) -> None:
    log: list[str] = []
    server = Server(HTTPPolicies([], retry=three()), [503, 500, 502], clock)
    response = await clock.run(releasing(server, log))
    assert response.n == 2 and not response.closed  # attempts exhausted: the caller's, untouched
    assert log == ["drain 0", "close 0", "drain 1", "close 1"]


async def test_a_retried_race_releases_the_failed_races_responses_before_its_backoff(clock: VirtualClock) -> None:
    log: list[str] = []
    hedge = Hedge(0.01, label="h", budget=RetryBudget.UNLIMITED)
    server = Server(HTTPPolicies([], retry=three(), hedge=hedge), [503, 503, 200], clock, takes=[0.02, 0.0, 0.0])
    task = asyncio.ensure_future(releasing(server, log))
    await clock.advance(0.05)  # the race (a slow attempt and its hedge) failed; its retry sleeps
    assert sorted(log) == ["close 0", "close 1", "drain 0", "drain 1"] and server.calls == 2
    await clock.advance(0.2)
    response = await task
    assert response.status == 200 and not response.closed and len(log) == 4


async def test_a_cancelled_backoff_closes_the_failed_response_once(clock: VirtualClock) -> None:
    log: list[str] = []
    server = Server(HTTPPolicies([], retry=three()), [503, 200], clock)
    task = asyncio.ensure_future(releasing(server, log))
    await clock.advance(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["drain 0", "close 0"]


def test_retry_after_cap_is_a_duration_like_every_other() -> None:
    """``retry_after_cap`` takes seconds or a ``timedelta`` and is checked by the rule every
    public duration follows (docs/design.md, "Durations"): ``[0, MAX_SECONDS]``, a ``TypeError``
    for a bool or a non-number."""
    from datetime import timedelta

    from stoic._durations import MAX_SECONDS

    assert HTTPPolicies(retry_after_cap=timedelta(minutes=2)).retry_after_cap == 120.0
    assert HTTPPolicies(retry_after_cap=timedelta(0)).retry_after_cap == 0.0
    assert HTTPPolicies(retry_after_cap=7).retry_after_cap == 7.0
    for bad in (-1, -0.5, float("nan"), float("inf"), MAX_SECONDS + 1, 1e300, timedelta(seconds=-1)):
        with pytest.raises(ValueError, match="retry_after_cap"):
            HTTPPolicies(retry_after_cap=bad)
    for wrong in (True, "300", None):
        with pytest.raises(TypeError, match="retry_after_cap"):
            HTTPPolicies(retry_after_cap=wrong)  # type: ignore[arg-type]
