"""Hostile review of retry, Retrying and pipelines (second round): a misused operation."""

from __future__ import annotations

from typing import Any

import pytest

import stoic
from stoic import CircuitBreaker, Pipeline, RetryBudget, Retrying, Schedule
from stoic.testing import RecordingSink, VirtualClock

THREE = Schedule.fixed(1).attempts(3)


async def fetch(user_id: int) -> int:
    return user_id


def fetch_sync(user_id: int) -> int:
    return user_id


def _retry_everything(error: BaseException) -> bool:
    return True


# --- the misuse rule: raised at once, never retried, no event, nothing earned or spent ---------

@pytest.mark.parametrize("classify", [stoic.RetryClassifier.standard, _retry_everything], ids=["standard", "all"])
@pytest.mark.parametrize("call", [((1, 2), {}), ((), {}), ((1,), {"nope": 1})], ids=["extra", "missing", "keyword"])
async def test_an_operation_called_with_arguments_it_does_not_take_is_raised_at_once(
    classify: Any, call: tuple[tuple[Any, ...], dict[str, Any]], clock: VirtualClock, sink: RecordingSink
) -> None:
    # Seen failing before the fix: a classifier retrying everything retried Python's binding
    # TypeError three times (two backoffs, two tokens), and the standard one reported it as
    # retry.permanent, where a plain function's unawaitable value is raised with no event.
    budget = RetryBudget(reserve_capacity=5, clock=clock)
    args, kwargs = call
    with pytest.raises(TypeError, match=r"fetch\(\)"):
        await clock.run(stoic.retry(THREE, fetch, *args, label="op", classify=classify, budget=budget, **kwargs))
    assert sink.names == []
    assert clock.now() == 0
    assert budget.tokens == 5  # nothing spent, and the call that never ran earned nothing


@pytest.mark.parametrize("classify", [stoic.RetryClassifier.standard, _retry_everything], ids=["standard", "all"])
def test_retry_sync_raises_an_operation_called_wrongly_at_once(
    classify: Any, jumping_clock: VirtualClock, sink: RecordingSink
) -> None:
    budget = RetryBudget(reserve_capacity=5, clock=jumping_clock)
    with pytest.raises(TypeError, match=r"fetch_sync\(\)"):
        stoic.retry_sync(THREE, fetch_sync, 1, 2, label="op", classify=classify, budget=budget)
    assert sink.names == []
    assert budget.tokens == 5


async def test_a_retrying_stage_raises_an_inner_stages_misused_operation_at_once(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    # The Retrying stage's operation is the breaker's execute, not fetch: the binding error comes
    # out of the stage that called fetch. Before the fix it was retried (the classifier retries
    # everything) and each attempt counted by the breaker as the dependency failing.
    budget = RetryBudget(reserve_capacity=5, clock=clock)
    breaker = CircuitBreaker(label="b", minimum_calls=2)
    pipeline = Pipeline(Retrying(THREE, label="r", classify=_retry_everything, budget=budget), breaker)
    with pytest.raises(TypeError, match=r"fetch\(\)"):
        await clock.run(pipeline.execute(fetch, 1, 2))
    assert [name for name in sink.names if name.startswith("retry.")] == []
    assert breaker.snapshot.calls == 0
    assert budget.tokens == 5


async def test_an_outer_breaker_does_not_count_a_misuse_raised_through_a_retrying_stage(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    # Seen failing before the fix: Pipeline(breaker, Retrying) handed the breaker Retrying.execute
    # as its operation, so the binding error naming fetch was not recognised and was counted.
    breaker = CircuitBreaker(label="outer", minimum_calls=2)
    pipeline = Pipeline(breaker, Retrying(THREE, label="r", budget=RetryBudget.UNLIMITED))
    for _ in range(3):
        with pytest.raises(TypeError, match=r"fetch\(\)"):
            await clock.run(pipeline.execute(fetch, 1, 2))
    assert breaker.snapshot.calls == 0
    assert breaker.state is stoic.BreakerState.CLOSED


async def test_a_wrong_call_inside_the_operation_is_still_its_own_failure(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    calls: list[int] = []

    async def op() -> int:
        calls.append(1)
        return await fetch(1, 2)  # type: ignore[call-arg]  # the operation's own bug, under its frame

    with pytest.raises(TypeError):
        await clock.run(stoic.retry(THREE, op, label="op", classify=_retry_everything,
                                    budget=RetryBudget.UNLIMITED))
    assert calls == [1, 1, 1]


@pytest.mark.parametrize("nesting", [stoic.RetryNesting.SINGLE_ATTEMPT, stoic.RetryNesting.ALLOW])
async def test_a_misuse_in_a_nested_retry_takes_back_exactly_the_deposits_made(
    nesting: stoic.RetryNesting, clock: VirtualClock, sink: RecordingSink
) -> None:
    # The collapsed inner retry deposited nothing, so nothing of its is taken back; an ALLOW one
    # deposited, and takes that back. Either way the budget is as the successes left it.
    budget = RetryBudget(reserve_capacity=0, clock=clock)

    async def ok() -> int:
        return 1

    for _ in range(5):
        await stoic.retry(THREE, ok, label="ok", budget=budget)
    assert budget.tokens == pytest.approx(1.0)

    async def outer() -> int:
        return await stoic.retry(THREE, fetch, 1, 2, label="inner", budget=budget, nesting=nesting)

    with pytest.raises(TypeError, match=r"fetch\(\)"):
        await clock.run(stoic.retry(THREE, outer, label="outer", budget=budget, classify=_retry_everything))
    assert budget.tokens == pytest.approx(1.0)
    assert sink.names == []


# --- a token pays for a retry that runs: one cancelled in its backoff gets it back ---------------

async def test_hundreds_of_retries_cancelled_in_their_backoff_give_their_tokens_back(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    # Seen failing before the fix: 300 callers cancelled while backing off (clients gone) kept
    # the 300 tokens they had spent, for retries that never ran, draining a shared budget that
    # the callers still there needed through the outage.
    import asyncio
    import random

    budget = RetryBudget(reserve_capacity=1000, reserve_per_second=0, clock=clock)
    started: list[int] = []
    durations = random.Random(3)

    async def op(attempt: stoic.Attempt) -> None:
        started.append(attempt.number)
        await clock.sleep(durations.random())
        raise ConnectionError

    async def main() -> None:
        tasks = [asyncio.create_task(stoic.retry(Schedule.fixed(1).attempts(4), op, label="r", budget=budget))
                 for _ in range(300)]
        rng = random.Random(7)
        for _ in range(40):  # cancel at random instants: in attempts and in backoffs alike
            await clock.sleep(0.1)
            for task in rng.sample(tasks, 12):
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    await clock.run(main())
    retries = sum(1 for number in started if number > 1)
    # Each call deposited 0.2; each retry that actually started cost one token, no more.
    assert budget.tokens == pytest.approx(1000 + 300 * 0.2 - retries)


async def test_a_retry_cancelled_in_its_backoff_gives_its_token_back(clock: VirtualClock) -> None:
    import asyncio

    budget = RetryBudget(reserve_capacity=3, reserve_per_second=0, clock=clock)

    async def op() -> None:
        raise ConnectionError

    async def main() -> None:
        task = asyncio.create_task(stoic.retry(Schedule.fixed(5).attempts(3), op, label="r", budget=budget))
        await clock.sleep(1)  # in its first backoff
        assert budget.tokens == pytest.approx(2.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    await clock.run(main())
    assert budget.tokens == pytest.approx(3.2)


# --- the commonest misuse: the operation's coroutine handed over instead of the operation ------

async def _fetch_one() -> int:
    return 1


@pytest.mark.parametrize("form", ["retry", "stage", "pipeline", "breaker"])
async def test_a_coroutine_object_in_place_of_the_operation_is_raised_at_once_and_never_counted(
    form: str, clock: VirtualClock, sink: RecordingSink
) -> None:
    # ``retry(schedule, fetch(), ...)``: Seen failing before the fix: "'coroutine' object is not
    # callable" was retried by a classifier retrying everything (two tokens spent), counted by a
    # breaker as the dependency failing (one buggy call site could open the circuit for every
    # caller), and reported as retry.attempt_failed / breaker.recorded.
    import gc
    import warnings

    budget = RetryBudget(reserve_capacity=5, clock=clock)
    breaker = CircuitBreaker(label="b", minimum_calls=1)
    retrying = Retrying(THREE, label="r", classify=_retry_everything, budget=budget)
    run = {
        "retry": lambda c: stoic.retry(THREE, c, label="r", classify=_retry_everything, budget=budget),
        "stage": lambda c: retrying.execute(c),
        "pipeline": lambda c: Pipeline(retrying, breaker).execute(c),
        "breaker": lambda c: Pipeline(breaker, Retrying(THREE, label="r2", budget=budget)).execute(c),
    }[form]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match="'coroutine' object is not callable"):
            await clock.run(run(_fetch_one()))
        gc.collect()
    assert [name for name in sink.names if not name.startswith("breaker.defect")] == []
    assert breaker.snapshot.calls == 0
    assert budget.tokens == 5
    if form in ("retry", "stage"):  # (closed where it was handed over: no "never awaited" warning on top)
        assert [w for w in caught if "never awaited" in str(w.message)] == []


# --- a deadline already passed: every policy refuses to start work that is already late --------

@pytest.mark.parametrize("form", ["retry", "stage", "decorated", "timed", "sync"])
async def test_a_retry_refuses_to_start_once_the_deadline_has_passed(
    form: str, clock: VirtualClock, sink: RecordingSink
) -> None:
    # Seed 000, "Cancellation and deadlines, for every policy": a policy that finds the ambient
    # deadline already passed rejects with deadline_exceeded rather than starting work that is
    # already late. Seen failing before the fix: retry and Retrying ran the operation (a request
    # sent after the caller's deadline) where a breaker, bulkhead, limiter and hedge refuse.
    budget = RetryBudget(reserve_capacity=0, clock=clock)
    calls: list[float] = []

    async def op() -> str:
        calls.append(clock.now())
        return "ran"

    def op_sync() -> str:
        calls.append(clock.now())
        return "ran"

    decorated = stoic.retrying(THREE, label="r", budget=budget)(op)
    stage = Retrying(THREE, label="r", budget=budget)

    async def main() -> object:
        async with stoic.deadline(clock.now() - 1):
            if form == "retry":
                return await stoic.retry(THREE, op, label="r", budget=budget)
            if form == "stage":
                return await stage.execute(op)
            if form == "decorated":
                return await decorated()
            if form == "timed":
                return await stoic.retry(THREE, op, label="r", budget=budget, attempt_timeout=5)
            return stoic.retry_sync(THREE, op_sync, label="r", budget=budget)

    with pytest.raises(stoic.DeadlineExceeded) as raised:
        await clock.run(main())
    assert calls == []
    assert raised.value.label == "r" and not raised.value.timed_out
    assert [(e.name, dict(e.attributes)) for e in sink.events if e.name.startswith("retry.")] == [
        ("retry.deadline_skip", {"attempt": 0, "error.type": "DeadlineExceeded"})]
    assert budget.tokens == 0  # no request, no deposit
