"""Hostile review of hedge (second round): a misused operation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stoic import IDEMPOTENT, Hedge, RetryBudget
from stoic.testing import RecordingSink, VirtualClock


async def fetch(user_id: int) -> int:
    return user_id


def plain() -> int:
    return 5


# --- the misuse rule: raised at once, never hedged, no event, nothing earned or spent ----------

@pytest.mark.parametrize("call", [(fetch, (1, 2), {}), (fetch, (), {}), (fetch, (1,), {"nope": 1}), (plain, (), {})],
                         ids=["extra", "missing", "keyword", "plain-function"])
async def test_a_misused_first_attempt_is_raised_with_no_event_and_earns_nothing(
    call: tuple[Any, tuple[Any, ...], dict[str, Any]], clock: VirtualClock, sink: RecordingSink
) -> None:
    # Seen failing before the fix: hedge.attempt_failed was reported (an attempt that never
    # reached the dependency), and the call's deposit earned the budget 0.2 tokens, where retry
    # raises the same misuse with no event.
    budget = RetryBudget(reserve_capacity=0, clock=clock)
    fn, args, kwargs = call
    policy = Hedge(0.1, label="h", budget=budget)
    for _ in range(3):
        with pytest.raises(TypeError):
            await clock.run(policy.execute(IDEMPOTENT, fn, *args, **kwargs))
    assert sink.names == []
    assert budget.tokens == 0
    assert clock.pending_timers == 0


async def test_a_misused_hedge_attempt_stops_the_call_and_gives_its_token_back(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    # An operation whose later calls are misused (here: a plain function handing back a
    # coroutine once, then None). Before the fix the hedge's TypeError was one attempt's failure:
    # the slow first attempt went on, a third attempt was started and its result returned, and
    # the bug was lost (reported only as a debug hedge.attempt_failed).
    budget = RetryBudget(reserve_capacity=5, clock=clock)
    calls: list[int] = []
    cancelled: list[int] = []

    async def slow() -> str:
        try:
            await clock.sleep(1.0)
        except asyncio.CancelledError:
            cancelled.append(1)
            raise
        return "slow"

    def op() -> Any:
        calls.append(1)
        return slow() if len(calls) != 2 else None

    policy = Hedge(0.1, label="h", max_attempts=3, budget=budget)
    with pytest.raises(TypeError, match="await"):
        await clock.run(policy.execute(IDEMPOTENT, op))
    assert calls == [1, 1]  # no third attempt
    assert cancelled == [1]  # the first attempt was stopped and awaited
    assert clock.now() == pytest.approx(0.1)
    assert "hedge.attempt_failed" not in sink.names
    # The misused hedge's token came back; the first attempt, a real request, earned its 0.2.
    assert budget.tokens == pytest.approx(5.2)


# --- a token pays for a hedge that runs: one cancelled before its first step gets it back -------

async def test_a_hedge_cancelled_before_it_ever_ran_gives_its_token_back(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    # The first attempt's response lands in the same loop iteration as the hedge timer, ahead
    # of the hedge task's first step (as a socket's readiness is handled before due timers on a
    # real loop; here the hedge's own call resolves it): the hedge task is created, and the
    # first attempt wins and cancels it before its coroutine ever starts. Seen failing before
    # the fix: the token stayed spent, for a hedge that sent nothing.
    budget = RetryBudget(reserve_capacity=5, reserve_per_second=0, clock=clock)
    loop = asyncio.get_running_loop()
    ran: list[int] = []

    async def main() -> object:
        response = loop.create_future()

        async def body(number: int) -> object:
            ran.append(number)
            if number == 1:
                return await response
            await clock.sleep(1)
            return "hedge"

        def op(attempt: Any) -> Any:
            if attempt.number == 2:
                response.set_result("first")  # (wakes the first attempt ahead of the new task)
            return body(attempt.number)

        return await Hedge(0.1, label="h", budget=budget).execute(IDEMPOTENT, op)

    assert await clock.run(main()) == "first"
    factory = loop.get_task_factory()
    if factory is not None and factory is getattr(asyncio, "eager_task_factory", None):
        # Tasks that start eagerly (3.12's eager_task_factory) run the hedge's first step inside
        # create_task: it ran, and its token pays for it.
        assert ran == [1, 2]
        assert budget.tokens == pytest.approx(4.2)
        return
    assert ran == [1]  # the hedge never ran
    assert budget.tokens == pytest.approx(5.2)  # its token came back; the call earned 0.2


async def test_a_coroutine_object_in_place_of_the_operation_is_raised_at_once(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    # Seen failing before the fix: reported as hedge.attempt_failed, the deposit kept, and the
    # coroutine left to warn "never awaited".
    import gc
    import warnings

    budget = RetryBudget(reserve_capacity=0, clock=clock)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match="'coroutine' object is not callable"):
            await clock.run(Hedge(0.1, label="h", budget=budget).execute(IDEMPOTENT, fetch(1)))  # type: ignore[arg-type]
        gc.collect()
    assert sink.names == []
    assert budget.tokens == 0
    assert [w for w in caught if "never awaited" in str(w.message)] == []


# --- a Defect is never hedged past: it stops the call, as retry never retries one ---------------

@pytest.mark.parametrize("defective", [1, 2], ids=["first-attempt", "hedge"])
async def test_a_defect_in_any_attempt_stops_the_call_and_is_raised(
    defective: int, clock: VirtualClock, sink: RecordingSink
) -> None:
    # Seen failing before the fix: the Defect (a bug in our code, "never retried", loud by
    # design) was one attempt's failure like any other: the call waited for the other attempt
    # and returned its value, the bug reported only at debug level.
    from stoic import Defect

    cancelled: list[int] = []

    async def op(attempt: Any) -> str:
        try:
            if attempt.number == defective:
                await clock.sleep(0.15)
                raise Defect("a bug")
            await clock.sleep(1.0)
        except asyncio.CancelledError:
            cancelled.append(attempt.number)
            raise
        return "other"

    with pytest.raises(Defect):
        await clock.run(Hedge(0.1, label="h", budget=RetryBudget.UNLIMITED).execute(IDEMPOTENT, op))
    assert cancelled == [3 - defective]  # the other attempt was stopped, and awaited
    assert clock.now() == pytest.approx(0.15 if defective == 1 else 0.25)
