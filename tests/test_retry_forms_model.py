"""retry(), Retrying.execute and @retrying run one first attempt, written once and compiled into
each (stoic._retry._FIRST_ATTEMPT): over random schedules, outcomes, budgets, deadlines and
nesting, the three must be indistinguishable (result or error, attempts and what each was
handed, every event with its time and attributes). retry() is the reference the other two are
compared with, one hypothesis example at a time."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import stoic
from stoic import Defect, RetryBudget, Retrying, RetryNesting, Schedule, retry, retrying
from stoic.testing import RecordingSink, VirtualClock, reset_budgets

OUTCOMES = ["ok", "slow ok", "transient", "slow transient", "permanent", "defect", "base"]


class Stop(BaseException):
    """Never retried, never swallowed."""


def _operation(script: list[str], clock: VirtualClock, log: list[Any], wants: bool) -> Any:
    steps = iter(script)

    async def body(attempt: Any) -> str:
        log.append(None if attempt is None else (attempt.number, type(attempt).__name__))
        step = next(steps, "ok")
        if step.startswith("slow"):
            await clock.sleep(0.7)
        if step.endswith("ok"):
            return f"ok {len(log)}"
        raise {"transient": ConnectionError, "permanent": ValueError, "defect": Defect,
               "base": Stop}[step.rsplit(" ", 1)[-1]]()

    if wants:
        async def op(attempt: Any = None) -> str:
            return await body(attempt)
    else:
        async def op() -> str:  # type: ignore[misc]
            return await body(None)
    return op


def _event_rows(sink: RecordingSink) -> list[tuple[Any, ...]]:
    return [(e.name, e.label, e.time_ns, sorted(e.attributes.items())) for e in sink.events
            if e.name.startswith("retry.")]


async def _scenario(form: str, scripts: list[list[str]], delays: list[float], budget: str, reset_between: bool,
                    deadline: float | None, nesting: RetryNesting | None, wants: bool, passes: bool,
                    clock: VirtualClock) -> list[Any]:
    schedule = Schedule.delays(delays)
    options: dict[str, Any] = {"label": "op", "clock": clock}
    if budget == "tight":  # (one budget object: shared by both calls, never reset)
        options["budget"] = RetryBudget(ratio=0.1, reserve_per_second=0.0, reserve_capacity=2, clock=clock)
    policy = Retrying(schedule, **options) if form == "execute" else None
    decorate = retrying(schedule, **options)
    outcomes: list[Any] = []
    logs: list[list[Any]] = [[] for _ in scripts]
    ops = [_operation(script, clock, log, wants) for script, log in zip(scripts, logs, strict=True)]
    wrapped = [decorate(op) for op in ops]  # (one decoration: one per-call-site budget for both calls)
    for index, op in enumerate(ops):
        if index and reset_between:
            reset_budgets()
        extra = {"attempt": "mine"} if passes else {}

        async def one(op: Any = op, index: int = index, extra: dict[str, Any] = extra) -> Any:
            if form == "retry":
                return await retry(schedule, op, **options, **extra)
            if form == "execute":
                assert policy is not None
                return await policy.execute(op, **extra)
            return await wrapped[index](**extra)

        async def bounded(one: Any = one) -> Any:
            if deadline is None:
                return await one()
            async with stoic.timeout(deadline, clock=clock):
                return await one()

        async def run(bounded: Any = bounded) -> Any:
            if nesting is None:
                return await bounded()
            return await retry(Schedule.fixed(0).attempts(1), bounded, label="outer", nesting=nesting, clock=clock)

        try:
            outcomes.append(("value", await run()))
        except BaseException as error:  # (Stop included: compared, like every other outcome)
            outcomes.append(("error", type(error).__name__))
        outcomes.append(("at", clock.now_ns()))
    return [outcomes, logs]


@settings(max_examples=60, deadline=None)
@given(
    scripts=st.lists(st.lists(st.sampled_from(OUTCOMES), max_size=5), min_size=1, max_size=3),
    delays=st.lists(st.sampled_from([0.0, 0.25, 1.0, 3.0]), max_size=4),
    budget=st.sampled_from(["site", "tight"]),
    reset_between=st.booleans(),
    deadline=st.sampled_from([None, 0.5, 2.0, 6.0]),
    nesting=st.sampled_from([None, RetryNesting.ALLOW, RetryNesting.SINGLE_ATTEMPT]),
    wants=st.booleans(),
    passes=st.booleans(),
)
def test_the_three_async_forms_are_indistinguishable(
    scripts: list[list[str]], delays: list[float], budget: str, reset_between: bool, deadline: float | None,
    nesting: RetryNesting | None, wants: bool, passes: bool,
) -> None:
    if passes and not wants:
        passes = False  # (an operation without an attempt parameter cannot be handed one)
    seen: dict[str, Any] = {}
    for form in ("retry", "execute", "decorator"):
        reset_budgets()
        clock = VirtualClock()
        sink = RecordingSink()
        with stoic.use_sinks(sink), stoic.use_clock(clock):
            got = asyncio.run(clock.run(_scenario(form, scripts, delays, budget, reset_between, deadline, nesting,
                                                  wants, passes, clock)))
        seen[form] = (got, _event_rows(sink))
    assert seen["execute"] == seen["retry"]
    assert seen["decorator"] == seen["retry"]
