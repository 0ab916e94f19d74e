"""The first attempt's shortcuts keep retry's rules: what a call site or a ``Retrying`` remembers
between calls (whether the operation wants an Attempt, its budget) never leaks into another
operation or call site, and the in-attempt mark is exactly as before, nested or not."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import pytest

from stoic import Attempt, RetryBudget, Retrying, Schedule, retry, retry_sync, retrying
from stoic._retry import in_retry_attempt
from stoic.testing import VirtualClock, fail_with, reset_budgets

THREE = Schedule.exponential(1).attempts(3)
DRAIN = Schedule.fixed(0).attempts(100)
NOW_THREE = Schedule.fixed(0).attempts(3)


def _plain() -> str:
    return "plain"


def _wants(attempt: Attempt) -> str:
    return f"wants {attempt.number}"


def _wants_too(x: int, attempt: Attempt) -> str:
    return f"partial {x} {attempt.number}"


class _Callable:
    def __call__(self, attempt: Attempt) -> str:
        return f"object {attempt.number}"


class _Client:
    def get(self, attempt: Attempt) -> str:
        return f"method {attempt.number}"

    def ping(self) -> str:
        return "ping"


def _operations() -> list[tuple[Callable[..., str], str]]:
    client = _Client()
    return [
        (_plain, "plain"),
        (_wants, "wants 1"),
        (_plain, "plain"),
        (functools.partial(_wants_too, 4), "partial 4 1"),
        (_plain, "plain"),
        (_Callable(), "object 1"),
        (client.ping, "ping"),
        (client.get, "method 1"),
        (lambda: "lambda", "lambda"),
        (_wants, "wants 1"),
        (client.ping, "ping"),
    ]


async def _aplain() -> str:
    return "plain"


async def _awants(attempt: Attempt) -> str:
    return f"wants {attempt.number}"


async def _awants_too(x: int, attempt: Attempt) -> str:
    return f"partial {x} {attempt.number}"


class _ACallable:
    async def __call__(self, attempt: Attempt) -> str:
        return f"object {attempt.number}"


class _AClient:
    async def get(self, attempt: Attempt) -> str:
        return f"method {attempt.number}"

    async def ping(self) -> str:
        return "ping"


def _async_operations() -> list[tuple[Callable[..., Any], str]]:
    client = _AClient()
    return [
        (_aplain, "plain"),
        (_awants, "wants 1"),
        (_aplain, "plain"),
        (functools.partial(_awants_too, 4), "partial 4 1"),
        (_aplain, "plain"),
        (_ACallable(), "object 1"),
        (client.ping, "ping"),
        (client.get, "method 1"),
        (lambda: _aplain(), "plain"),
        (_awants, "wants 1"),
        (client.ping, "ping"),
    ]


class TestOneCallSiteManyOperations:
    def test_retry_sync_hands_an_attempt_to_exactly_those_declaring_one(self) -> None:
        results = [retry_sync(THREE, fn, label="op") for fn, _ in _operations() * 2]  # one call site for all
        assert results == [expected for _, expected in _operations() * 2]

    def test_a_callers_own_attempt_wins_at_a_site_that_remembers_the_operation(self) -> None:
        got = [retry_sync(THREE, _wants, **({"attempt": Attempt(7)} if i % 2 else {}), label="op") for i in range(4)]
        assert got == ["wants 1", "wants 7", "wants 1", "wants 7"]

    async def test_retry_hands_an_attempt_to_exactly_those_declaring_one(self) -> None:
        results = [await retry(THREE, fn, label="op") for fn, _ in _async_operations() * 2]  # one call site for all
        assert results == [expected for _, expected in _async_operations() * 2]

    def test_retrying_call_remembers_no_operation_for_another(self) -> None:
        policy = Retrying(THREE, label="op")
        assert [policy.call(fn) for fn, _ in _operations() * 2] == [e for _, e in _operations() * 2]

    async def test_retrying_execute_remembers_no_operation_for_another(self) -> None:
        policy = Retrying(THREE, label="op")
        results = [await policy.execute(fn) for fn, _ in _async_operations() * 2]
        assert results == [expected for _, expected in _async_operations() * 2]


def _site_a(op: Callable[[], object]) -> object:
    return retry_sync(DRAIN, op, label="op")


def _site_b(op: Callable[[], object]) -> object:
    return retry_sync(DRAIN, op, label="op")


class TestCallSites:
    def test_call_sites_at_the_same_offset_of_different_functions_have_their_own_budgets(
            self, clock: VirtualClock) -> None:
        # Identical bodies: the retry_sync calls sit at the same instruction offset.
        assert _site_a.__code__.co_code == _site_b.__code__.co_code
        a, b = fail_with(ConnectionError()), fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            _site_a(a.sync)  # spends site a's reserve (10) and its own 0.2 earned
        with pytest.raises(ConnectionError):
            _site_a(a.sync)
        assert a.calls == 11 + 1
        with pytest.raises(ConnectionError):
            _site_b(b.sync)
        assert b.calls == 11  # site b's budget is untouched by site a's retries

    def test_every_first_attempt_deposits_in_its_sites_budget(self, clock: VirtualClock) -> None:
        for _ in range(15):
            assert _site_a(lambda: 1) == 1  # 15 deposits of 0.2: 3 earned tokens
        op = fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            _site_a(op.sync)
        assert op.calls == 1 + 3 + 10  # its own deposit makes 3.2 earned: 3 whole tokens, then the reserve

    def test_a_site_is_forgotten_by_reset_budgets(self, clock: VirtualClock) -> None:
        with pytest.raises(ConnectionError):
            _site_b(fail_with(ConnectionError()).sync)
        reset_budgets()
        op = fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            _site_b(op.sync)
        assert op.calls == 11


class TestOneCallSiteChangingArguments:
    """What a call site remembers of a classify or attempt_timeout argument never outlives it."""

    def test_each_call_is_classified_by_its_own_classify(self, clock: VirtualClock) -> None:
        def is_timeout(error: BaseException) -> bool:
            return isinstance(error, TimeoutError)

        # (classify, the error raised, attempts made): tuples are built anew at every call.
        cases: list[tuple[Any, BaseException, int]] = [
            ((ConnectionError,), ConnectionError(), 3), ((ConnectionError,), TimeoutError(), 1),
            ((TimeoutError,), ConnectionError(), 1), ((TimeoutError, ConnectionError), ConnectionError(), 3),
            ((ConnectionError,), TimeoutError(), 1), (is_timeout, TimeoutError(), 3), (is_timeout, OSError(), 1),
            (ConnectionError, ConnectionError(), 3), ((ConnectionError, 5), None, 0), (5, None, 0),
            ((ConnectionError,), ConnectionError(), 3),
        ]
        made = []
        for classify, error, _ in cases:
            op = fail_with(error if error is not None else ConnectionError())
            try:
                retry_sync(NOW_THREE, op.sync, classify=classify, budget=RetryBudget.UNLIMITED, label="op")
            except TypeError:
                assert error is None
            except (ConnectionError, TimeoutError, OSError) as raised:
                assert type(raised) is type(error)
            made.append(op.calls)
        assert made == [n for _, _, n in cases]

    async def test_each_call_runs_under_its_own_attempt_timeout(self, clock: VirtualClock) -> None:
        from stoic import DeadlineExceeded

        async def slow() -> str:
            await clock.sleep(0.5)
            return "done"

        results = []
        for timeout in (1.0, 0.25, 1.0, 0.25, -1.0, 0, "x", 2.0):
            try:
                results.append(await clock.run(retry(Schedule.fixed(0).attempts(1), slow, attempt_timeout=timeout,
                                                      label="op")))
            except DeadlineExceeded:
                results.append("timed out")
            except (ValueError, TypeError) as refused:
                results.append(type(refused).__name__)
        assert results == ["done", "timed out", "done", "timed out", "ValueError", "ValueError", "TypeError", "done"]


class TestFirstAttempt:
    def test_the_first_attempt_is_an_ordinary_immutable_attempt_one(self) -> None:
        seen: list[Attempt] = []

        def op(attempt: Attempt) -> str:
            seen.append(attempt)
            if attempt.number < 2:
                raise ConnectionError
            return "done"

        assert retry_sync(NOW_THREE, op, label="op") == "done"
        first, second = seen
        assert isinstance(first, Attempt) and (first.number, first.hedged, first.is_first) == (1, False, True)
        assert first == Attempt(1, first.call_id) and hash(first) == hash(Attempt(1, first.call_id))
        assert first.next() == second and second.call_id == first.call_id == first.idempotency_key
        assert repr(first) == f"Attempt(number=1, call_id={first.call_id!r}, hedged=False)"
        with pytest.raises(AttributeError):
            first.number = 2  # type: ignore[misc]
        assert first.number == 1


class TestRetryingBudget:
    def test_first_attempts_deposit_in_the_budget_resolved_at_construction(self, clock: VirtualClock) -> None:
        policy = Retrying(THREE, label="op")
        bucket = policy.budget
        assert bucket is not RetryBudget.PER_CALL_SITE and bucket.tokens == 10
        for _ in range(5):
            policy.call(_plain)
        assert policy.budget is bucket and bucket.tokens == 11.0

    async def test_reset_budgets_gives_a_live_policy_a_fresh_budget(self, clock: VirtualClock) -> None:
        policy = Retrying(DRAIN, label="op")
        op = fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            await clock.run(policy.execute(op))
        drained = policy.budget
        assert drained.tokens < 1
        reset_budgets()
        assert policy.budget is not drained and policy.budget.tokens == 10
        op = fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            policy.call(op.sync)
        assert op.calls == 11

    def test_reset_budgets_gives_a_decorated_function_a_fresh_budget(self, clock: VirtualClock) -> None:
        op = fail_with(ConnectionError())
        decorated = retrying(DRAIN, label="op")(op.sync)
        with pytest.raises(ConnectionError):
            decorated()
        with pytest.raises(ConnectionError):
            decorated()
        assert op.calls == 11 + 1
        reset_budgets()
        with pytest.raises(ConnectionError):
            decorated()
        assert op.calls == 12 + 11

    def test_a_given_budget_is_kept_through_reset_budgets(self) -> None:
        budget = RetryBudget(reserve_capacity=3)
        policy = Retrying(THREE, budget=budget, label="op")
        reset_budgets()
        assert policy.budget is budget


class TestInAttemptMark:
    def test_set_during_the_attempt_and_cleared_after_success_error_and_base_exception(self) -> None:
        seen: list[bool] = []

        def op() -> int:
            seen.append(in_retry_attempt())
            return 1

        def interrupted() -> None:
            seen.append(in_retry_attempt())
            raise KeyboardInterrupt

        assert retry_sync(THREE, op, label="op") == 1
        assert not in_retry_attempt()
        with pytest.raises(KeyboardInterrupt):
            retry_sync(THREE, interrupted, label="op")
        assert not in_retry_attempt()
        with pytest.raises(KeyboardInterrupt):
            Retrying(THREE, label="op").call(interrupted)
        assert not in_retry_attempt()
        assert seen == [True, True, True]

    def test_a_nested_retry_leaves_the_outer_attempt_marked(self) -> None:
        after_inner: list[bool] = []
        inner = fail_with(ConnectionError())

        def outer() -> str:
            assert retry_sync(THREE, _plain, label="op") == "plain"
            after_inner.append(in_retry_attempt())
            with pytest.raises(ConnectionError):
                Retrying(THREE, label="op").call(inner.sync)
            after_inner.append(in_retry_attempt())
            return "done"

        assert retry_sync(THREE, outer, label="op") == "done"
        assert after_inner == [True, True]
        assert inner.calls == 1  # nested: a single attempt
        assert not in_retry_attempt()

    async def test_async_nested_retry_leaves_the_outer_attempt_marked(self, clock: VirtualClock) -> None:
        after_inner: list[bool] = []
        inner = fail_with(ConnectionError())

        async def plain() -> str:
            return "plain"

        async def outer() -> str:
            assert await retry(THREE, plain, label="op") == "plain"
            after_inner.append(in_retry_attempt())
            with pytest.raises(ConnectionError):
                await Retrying(THREE, label="op").execute(inner)
            after_inner.append(in_retry_attempt())
            return "done"

        # (clock.run: were the inner retry not single-attempt, its sleeps would end, not hang.)
        assert await clock.run(retry(THREE, outer, label="op")) == "done"
        assert await clock.run(retrying(THREE, label="op")(outer)()) == "done"
        assert after_inner == [True, True] * 2
        assert inner.calls == 2
        assert not in_retry_attempt()

    async def test_a_task_started_in_an_attempt_is_marked_only_while_that_attempt_runs(self) -> None:
        # The mark says "an attempt is running" (seed 001, "Nesting"): a task created inside one
        # is nested while that attempt runs, and free once it has ended (nothing retries it then).
        started: list[asyncio.Task[bool]] = []
        during: list[bool] = []
        release = asyncio.Event()

        async def later() -> bool:
            during.append(in_retry_attempt())
            await release.wait()
            return in_retry_attempt()

        def op() -> int:
            started.append(asyncio.get_running_loop().create_task(later()))
            return 1

        async def op_async() -> int:
            op()
            await asyncio.sleep(0)  # the child's first step runs inside the attempt
            return 1

        assert retry_sync(THREE, op, label="op") == 1
        assert await retry(THREE, op_async, label="op") == 1
        assert not in_retry_attempt()
        await asyncio.sleep(0)
        release.set()
        assert [await task for task in started] == [False, False]
        # The sync attempt had ended before its child first ran, unless tasks start eagerly
        # (3.12's eager_task_factory: the child's first step runs inside create_task).
        factory = asyncio.get_running_loop().get_task_factory()
        eager = factory is not None and factory is getattr(asyncio, "eager_task_factory", None)
        assert during == [eager, True]

    async def test_a_retry_in_a_task_outliving_the_attempt_that_made_it_retries_in_full(
            self, clock: VirtualClock) -> None:
        flaky = fail_with(ConnectionError())
        release = asyncio.Event()
        children: list[asyncio.Task[None]] = []

        async def background() -> None:
            await release.wait()
            await retry(THREE, flaky, label="bg")

        async def op() -> int:
            children.append(asyncio.get_running_loop().create_task(background()))
            return 1

        assert await retry(THREE, op, label="op") == 1
        release.set()
        with pytest.raises(ConnectionError):
            await clock.run(children[0])
        assert flaky.calls == 3  # not collapsed to one attempt: its creator's attempt had ended
