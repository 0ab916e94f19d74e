"""Pipeline and Retrying: stage order, flattening, flat errors, Retrying as a stage (seed 000)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import stoic
from stoic import (
    Attempt,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    Pipeline,
    Policy,
    RateLimited,
    RetryBudget,
    Retrying,
    Schedule,
)
from stoic.testing import RecordingSink, VirtualClock, fail_times, fail_with


class Stage:
    """A fake policy recording entry and exit into a shared log."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def execute(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
        self.log.append(f">{self.name}")
        try:
            return await fn(*args, **kwargs)
        finally:
            self.log.append(f"<{self.name}")


class Refusing:
    """A fake policy that refuses its first ``n`` calls with ``rejection``."""

    def __init__(self, n: int, rejection: Exception) -> None:
        self.n = n
        self.rejection = rejection
        self.calls = 0
        self.seen: list[BaseException] = []

    async def execute(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls <= self.n:
            raise self.rejection
        try:
            return await fn(*args, **kwargs)
        except Exception as error:
            self.seen.append(error)
            raise


async def test_stages_run_outermost_first(clock: VirtualClock) -> None:
    log: list[str] = []

    async def op(x: int) -> int:
        log.append("op")
        return x + 1

    pipeline = Pipeline(Stage("a", log), Stage("b", log), Stage("c", log))
    assert await pipeline.execute(op, 1) == 2
    assert log == [">a", ">b", ">c", "op", "<c", "<b", "<a"]
    assert isinstance(pipeline, Policy)


async def test_nested_pipelines_and_lists_are_flattened(clock: VirtualClock) -> None:
    log: list[str] = []
    a, b, c, d = (Stage(n, log) for n in "abcd")
    pipeline = Pipeline(a, Pipeline(b, [c]), Pipeline(), d)
    assert pipeline.stages == (a, b, c, d)
    assert len(pipeline) == 4

    async def op() -> str:
        return "ok"

    assert await Pipeline(Pipeline(pipeline)).execute(op) == "ok"
    assert log == [">a", ">b", ">c", ">d", "<d", "<c", "<b", "<a"]


async def test_an_empty_pipeline_just_runs_the_operation() -> None:
    async def op(x: int, *, y: int) -> int:
        return x * y

    assert await Pipeline().execute(op, 3, y=4) == 12


def test_a_stage_must_be_a_policy() -> None:
    with pytest.raises(TypeError, match="execute"):
        Pipeline(object())  # type: ignore[arg-type]


def test_a_hedge_is_refused_as_a_stage_at_construction() -> None:
    # It has an execute, but one taking IDEMPOTENT first: accepted, every call failed with
    # "missing 1 required positional argument". It wraps a pipeline from the outside.
    hedged = stoic.Hedge(0.1, label="h")
    with pytest.raises(TypeError, match="not a Policy"):
        Pipeline(stoic.Bulkhead(1, label="b"), hedged)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a Policy"):
        Pipeline([hedged])  # type: ignore[list-item]
    # (The way out it names for an operation declaring attempt hands it the hedge's attempts.)
    with pytest.raises(TypeError, match=r"hedge.execute\(stoic.IDEMPOTENT, pipeline\(fn\)\) when fn declares attempt"):
        Pipeline(hedged)  # type: ignore[arg-type]


@pytest.mark.parametrize("stage", [CircuitBreaker, Retrying, stoic.Bulkhead, stoic.Keyed(stoic.Bulkhead, label="fam",
                                                                                   max_concurrent=1)],
                         ids=["breaker-class", "retrying-class", "bulkhead-class", "keyed-family"])
def test_a_policy_class_or_a_keyed_family_is_refused_as_a_stage_at_construction(stage: Any) -> None:
    # Each has a callable execute, so it was accepted, and every call then failed: a class's
    # execute is unbound (the operation taken for self: AttributeError '_now'), a family's takes
    # a key first ("a key must be a str"). Like the hedge, refused when the pipeline is built.
    with pytest.raises(TypeError, match="not a Policy"):
        Pipeline(stoic.Bulkhead(1, label="b"), stage)
    with pytest.raises(TypeError, match="not a Policy"):
        Pipeline([stage])
    family = stoic.Keyed(stoic.Bulkhead, label="fam2", max_concurrent=1)
    assert len(Pipeline(family.get("k"))) == 1  # (its policies are)


def test_the_same_stage_twice_is_refused_at_construction_naming_its_positions() -> None:
    # Accepted, and every call then went through it twice: a breaker counted each call twice,
    # a Bulkhead(1, queue_limit=0) refused every call with its own slot, a Retrying retried
    # inside itself. Refused when the pipeline is built, at the positions of the flat stages.
    breaker = CircuitBreaker(label="b")
    bulkhead = stoic.Bulkhead(1, queue_limit=0, label="bh")
    retrying = Retrying(Schedule.fixed(0).attempts(2), label="r")
    with pytest.raises(ValueError, match=r"stages: .*CircuitBreaker\(label='b'.* at positions 0 and 1"):
        Pipeline(breaker, breaker)
    with pytest.raises(ValueError, match=r"Bulkhead.* at positions 1 and 3"):
        Pipeline(retrying, bulkhead, breaker, bulkhead)
    with pytest.raises(ValueError, match=r"Retrying.* at positions 0 and 2"):
        Pipeline(retrying, [breaker], Pipeline(retrying))  # (found after flattening)
    with pytest.raises(ValueError, match=r"CircuitBreaker.* at positions 1 and 2"):
        Pipeline(retrying, [breaker, (breaker,)])  # (positions in the whole pipeline, not in the list)
    inner = Pipeline(breaker, bulkhead)
    with pytest.raises(ValueError, match=r"CircuitBreaker.* at positions 0 and 2.*Bulkhead.* at positions 1 and 3"):
        Pipeline(inner, inner)
    family = stoic.Keyed(stoic.Bulkhead, label="fam3", max_concurrent=1)
    with pytest.raises(ValueError, match=r"at positions 0, 1 and 2"):
        Pipeline(family.get("k"), family.get("k"), family.get("k"))
    # Distinct objects, however alike, are distinct stages; a stage may be in several pipelines.
    assert len(Pipeline(family.get("k"), family.get("j"), CircuitBreaker(label="b"), breaker)) == 4
    assert len(Pipeline(breaker, bulkhead)) == len(Pipeline(bulkhead, breaker)) == 2


async def test_a_one_slot_bulkhead_twice_is_refused_rather_than_refusing_every_call(clock: VirtualClock) -> None:
    bulkhead = stoic.Bulkhead(1, queue_limit=0, label="bh")
    with pytest.raises(ValueError, match="more than once"):
        Pipeline(bulkhead, bulkhead)

    async def op() -> str:
        return "ok"

    assert await clock.run(Pipeline(bulkhead).execute(op)) == "ok"  # (it used to refuse itself: BulkheadFull)


async def test_a_class_whose_execute_is_a_static_or_class_method_is_a_policy() -> None:
    class Stateless:
        @staticmethod
        async def execute(fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
            return ("static", await fn(*args, **kwargs))

    class Counting:
        calls = 0

        @classmethod
        async def execute(cls, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
            cls.calls += 1
            return await fn(*args, **kwargs)

    async def op(x: int) -> int:
        return x

    assert await Pipeline(Stateless, Counting).execute(op, 3) == ("static", 3)
    assert Counting.calls == 1


async def test_the_operations_own_error_comes_out_unchanged(clock: VirtualClock) -> None:
    log: list[str] = []
    op = fail_with(ValueError("bad"))
    with pytest.raises(ValueError) as caught:
        await Pipeline(Stage("a", log), Stage("b", log)).execute(op)
    assert caught.value is op.raised[0]
    assert caught.value.__cause__ is None


@pytest.mark.parametrize("rejection", [CircuitOpen(label="api"), RateLimited(label="api"), BulkheadFull(label="api")])
async def test_an_inner_rejection_comes_out_flat_and_is_the_outer_stages_operation_error(
        rejection: Exception, clock: VirtualClock) -> None:
    outer = Refusing(0, RuntimeError())
    inner = Refusing(10, rejection)
    op = fail_times(0, then="never")
    with pytest.raises(type(rejection)) as caught:
        await Pipeline(outer, inner).execute(op)
    assert caught.value is rejection
    assert outer.seen == [rejection]  # the outer stage saw the refusal as its operation's error
    assert op.calls == 0


async def test_retrying_honours_an_inner_rejections_retry_after(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = Refusing(1, CircuitOpen(label="api", retry_after=4.5))
    op = fail_times(0, then="ok")
    pipeline = Pipeline(Retrying(Schedule.fixed(0.2).attempts(3), label="op"), breaker)
    assert await clock.run(pipeline.execute(op)) == "ok"
    assert clock.now() == 4.5
    event = sink.of("retry.attempt_failed")[0]
    assert event.attributes["decision"] == "retry_after"
    assert event.attributes["error.type"] == "CircuitOpen"


async def test_retrying_retries_a_half_open_rejection_on_the_schedule(clock: VirtualClock) -> None:
    breaker = Refusing(2, CircuitOpen(label="api"))
    pipeline = Pipeline(Retrying(Schedule.fixed(0.2).attempts(3), label="op"), breaker)
    assert await clock.run(pipeline.execute(fail_times(0, then=1))) == 1
    assert clock.now() == pytest.approx(0.4)


async def test_retrying_passes_the_attempt_through_the_pipeline(clock: VirtualClock) -> None:
    log: list[str] = []
    seen: list[int] = []

    async def op(path: str, *, attempt: Attempt) -> str:
        seen.append(attempt.number)
        if attempt.number < 2:
            raise ConnectionError
        return path

    pipeline = Pipeline(Retrying(Schedule.fixed(1).attempts(3), label="op"), Stage("breaker", log))
    assert await clock.run(pipeline.execute(op, "/users")) == "/users"
    assert seen == [1, 2]
    assert log == [">breaker", "<breaker", ">breaker", "<breaker"]


async def test_an_operation_declaring_attempt_gets_a_first_attempt_from_a_pipeline_without_retrying(
    clock: VirtualClock,
) -> None:
    # The same operation works under retry(), under Pipeline(Retrying, ...) and must not crash
    # with a TypeError (counted by a breaker as a failure) under a pipeline with no Retrying.
    log: list[str] = []
    seen: list[Attempt] = []

    async def op(path: str, *, attempt: Attempt) -> str:
        seen.append(attempt)
        return path

    breaker = CircuitBreaker(label="api")
    for pipeline in (Pipeline(breaker), Pipeline(Stage("a", log), Stage("b", log))):
        assert await clock.run(pipeline.execute(op, "/users")) == "/users"
    assert [(a.number, a.hedged) for a in seen] == [(1, False), (1, False)]
    assert seen[0].call_id != seen[1].call_id
    assert breaker.snapshot.failures == 0


async def test_retrying_each_attempt_goes_through_the_inner_stages(clock: VirtualClock, sink: RecordingSink) -> None:
    log: list[str] = []
    op = fail_times(2, then="ok")
    pipeline = Pipeline(Stage("outer", log), Retrying(Schedule.fixed(1).attempts(3), label="api"), Stage("inner", log))
    assert await clock.run(pipeline.execute(op)) == "ok"
    assert log == [">outer", ">inner", "<inner", ">inner", "<inner", ">inner", "<inner", "<outer"]
    assert {e.label for e in sink.events} == {"api"}


async def test_retrying_labels_its_events_with_its_own_label(clock: VirtualClock, sink: RecordingSink) -> None:
    async def get_user() -> None:
        raise ConnectionError

    with pytest.raises(ConnectionError):
        await clock.run(Pipeline(Retrying(Schedule.fixed(0).attempts(2),
                label="users"), Stage("s", [])).execute(get_user))
    assert sink.events[0].label == "users"


async def test_retrying_budget_is_per_construction_site(clock: VirtualClock) -> None:
    first = Retrying(Schedule.fixed(0).attempts(50), label="op")
    second = Retrying(Schedule.fixed(0).attempts(50), label="op")
    assert first.budget is not second.budget
    assert first.budget is first.budget
    op = fail_with(ConnectionError())
    with pytest.raises(ConnectionError):
        await clock.run(first.execute(op))
    assert op.calls == 11  # 1 + the reserve of 10 (0.2 earned is not a token)
    op2 = fail_with(ConnectionError())
    with pytest.raises(ConnectionError):
        await clock.run(second.execute(op2))
    assert op2.calls == 11
    shared = RetryBudget.named("dep", reserve_capacity=2, reserve_per_second=0)
    a = Retrying(Schedule.fixed(0).attempts(9), budget=shared, label="op")
    b = Retrying(Schedule.fixed(0).attempts(9), budget=shared, label="op")
    op3, op4 = fail_with(ConnectionError()), fail_with(ConnectionError())
    for policy, op_ in ((a, op3), (b, op4)):
        with pytest.raises(ConnectionError):
            await clock.run(policy.execute(op_))
    assert (op3.calls, op4.calls) == (3, 1)


async def test_retrying_as_a_decorator_and_for_plain_functions(jumping_clock: VirtualClock) -> None:
    policy = Retrying(Schedule.fixed(1).attempts(3), label="op")
    calls = 0

    @policy
    async def fetch() -> int:
        nonlocal calls
        calls += 1
        if calls < 2:
            raise ConnectionError
        return calls

    assert await jumping_clock.run(fetch()) == 2
    op = fail_times(1, then="sync")
    assert policy.call(op.sync) == "sync"

    @policy
    def read() -> str:
        return "plain"

    assert read() == "plain"
    assert "Retrying(Schedule.fixed(1).attempts(3)" in repr(policy)


async def test_retrying_keeps_the_clock_it_was_built_with() -> None:
    built_on = VirtualClock()
    with stoic.use_clock(built_on):
        policy = Retrying(Schedule.fixed(5).attempts(2), label="op")
    op = fail_times(1, then="ok")
    assert await built_on.run(policy.execute(op)) == "ok"
    assert built_on.now() == 5


async def test_pipeline_as_a_decorator(clock: VirtualClock) -> None:
    log: list[str] = []
    pipeline = Pipeline(Stage("a", log))

    @pipeline
    async def op(x: int) -> int:
        return x * 3

    assert await op(2) == 6
    assert log == [">a", "<a"]
    with pytest.raises(TypeError):
        pipeline(lambda: 1)  # type: ignore[arg-type, return-value]


async def test_an_operation_decorated_by_a_pipeline_receives_the_attempt_of_a_retry_or_hedge_around_it(
        clock: VirtualClock) -> None:
    # The wrapper took (*args, **kwargs), so a retry or a hedge around it passed no attempt and
    # the pipeline (no Retrying stage) made a fresh Attempt(1) for each try: the same number on
    # every retry and a new call_id each time, the idempotency key changing between a request
    # and its retry. It declares attempt when the operation does, and forwards the one it gets.
    seen: list[tuple[int, bool, str]] = []
    pipeline = Pipeline(CircuitBreaker(label="b", clock=clock), stoic.Bulkhead(4, label="k", clock=clock))

    @pipeline
    async def op(x: int, attempt: Attempt | None = None) -> int:
        assert attempt is not None
        seen.append((attempt.number, attempt.hedged, attempt.call_id))
        if len(seen) < 3:
            raise ConnectionError("down")
        return x

    retrying = Retrying(Schedule.fixed(0.1).attempts(3), label="r", clock=clock)
    assert await clock.run(retrying.execute(op, 5)) == 5
    assert [(number, hedged) for number, hedged, _ in seen] == [(1, False), (2, False), (3, False)]
    assert len({call_id for *_, call_id in seen}) == 1

    seen.clear()
    with pytest.raises(ConnectionError):
        await clock.run(op(6, attempt=Attempt(7, "mine")))  # (one passed by the caller is used)
    assert seen == [(7, False, "mine")]
    seen.clear()

    @pipeline
    async def slow_first(attempt: Attempt) -> str:
        seen.append((attempt.number, attempt.hedged, attempt.call_id))
        await clock.sleep(0.6 if attempt.number == 1 else 0.01)
        return "ok"

    assert await clock.run(stoic.Hedge(0.1, label="h", clock=clock).execute(stoic.IDEMPOTENT, slow_first)) == "ok"
    assert [(number, hedged) for number, hedged, _ in seen] == [(1, False), (2, True)]
    assert len({call_id for *_, call_id in seen}) == 1

    seen.clear()
    assert await clock.run(slow_first()) == "ok"  # (called alone: the pipeline's own Attempt(1))
    assert [(number, hedged) for number, hedged, _ in seen] == [(1, False)]


async def test_an_explicit_attempt_none_reaches_a_pipeline_decorated_operation_as_through_execute(
        clock: VirtualClock) -> None:
    # The wrapper took attempt=None as "no attempt given" and handed the operation the
    # pipeline's own Attempt, where execute(op, attempt=None) passes the None the caller wrote.
    pipeline = Pipeline(CircuitBreaker(label="b", clock=clock))

    async def op(attempt: Attempt | None = None) -> object:
        return attempt

    assert await clock.run(pipeline.execute(op, attempt=None)) is None
    assert await clock.run(pipeline(op)(attempt=None)) is None
    given = await clock.run(pipeline(op)())
    assert isinstance(given, Attempt) and given.number == 1  # (none given: the pipeline's own)


async def test_nested_retrying_stages_collapse_to_the_outer_one(clock: VirtualClock, sink: RecordingSink) -> None:
    op = fail_with(ConnectionError())
    pipeline = Pipeline(Retrying(Schedule.fixed(0).attempts(3), label="op"), Retrying(Schedule.fixed(0).attempts(3),
            label="op"))
    with pytest.raises(ConnectionError):
        await clock.run(pipeline.execute(op))
    assert op.calls == 3
    assert len(sink.of("retry.nested")) == 3


async def test_two_retrying_stages_hand_the_operation_the_outer_stages_attempt(clock: VirtualClock) -> None:
    # The inner Retrying, collapsed to one attempt inside the outer's, handed the operation its
    # own fresh Attempt(1) on every try: the outer's retries reached it as first attempts, each
    # with a new call_id (an idempotency key changing between a request and its retry), while the
    # same stages composed through @pipeline (or with the attempt passed by hand) said 1, 2, 3.
    seen: list[tuple[int, str]] = []

    async def op(x: int, *, attempt: Attempt) -> int:
        seen.append((attempt.number, attempt.call_id))
        if len(seen) < 3:
            raise ConnectionError("down")
        return x

    def stages() -> tuple[Retrying, CircuitBreaker, Retrying]:
        return (Retrying(Schedule.fixed(0.1).attempts(3), label="outer"), CircuitBreaker(label="b"),
                Retrying(Schedule.fixed(0.1).attempts(3), label="inner"))

    outer, breaker, inner = stages()
    assert await clock.run(outer.execute(Pipeline(breaker, inner)(op), 5)) == 5  # (composed by decoration)
    by_decoration = [number for number, _ in seen]
    assert by_decoration == [1, 2, 3] and len({call_id for _, call_id in seen}) == 1
    for pipeline in (Pipeline(*stages()), Pipeline(stages()[0], Pipeline(*stages()[1:]))):
        seen.clear()
        assert await clock.run(pipeline.execute(op, 5)) == 5
        assert [number for number, _ in seen] == by_decoration
        assert len({call_id for _, call_id in seen}) == 1
        seen.clear()

        @pipeline
        async def decorated(x: int, *, attempt: Attempt | None = None) -> int:
            assert attempt is not None
            return await op(x, attempt=attempt)

        assert await clock.run(decorated(5)) == 5
        assert [number for number, _ in seen] == by_decoration
        assert len({call_id for _, call_id in seen}) == 1


def test_every_public_member_of_pipeline_and_retrying_is_documented() -> None:
    # Retrying.schedule and Retrying.label had no docstring (help() and the API docs showed none).
    for cls in (Pipeline, Retrying):
        for name, member in vars(cls).items():
            if name.startswith("_") or name == "op":  # (op: Pipeline's cache of its last operation's code)
                continue
            doc = member.fget.__doc__ if isinstance(member, property) else getattr(member, "__doc__", None)
            assert doc, f"{cls.__name__}.{name}"
