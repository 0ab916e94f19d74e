"""hedge / Hedge on virtual time: seed 000 "hedge" and its Testing list, and the deadline rules."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from _hedge_script import Script, Step

import stoic
from stoic import IDEMPOTENT, Hedge, RetryBudget, hedge
from stoic.testing import RecordingSink, VirtualClock


class Boom(Exception):
    pass


async def run_and_observe(clock: VirtualClock, script: Script, call: Any) -> tuple[object, float, set[int]]:
    """Run ``call`` (an awaitable) on virtual time; return its result, the return instant and
    the attempts still running at that instant."""

    async def observed() -> tuple[object, float, set[int]]:
        result = await call
        return result, clock.now(), set(script.running)

    result: tuple[object, float, set[int]] = await clock.run(observed())
    return result


async def test_a_fast_first_attempt_never_hedges(clock: VirtualClock, sink: RecordingSink) -> None:
    script = Script(clock, {1: Step(0.02, "one")})
    result, at, running = await run_and_observe(clock, script, hedge(IDEMPOTENT, script, delay=0.1, label="h"))
    assert (result, at, running) == ("one", pytest.approx(0.02), set())
    assert script.started() == [1]
    assert script.attempts[0].number == 1 and not script.attempts[0].hedged
    assert sink.events == []
    assert clock.pending_timers == 0  # the hedge timer was cancelled, not left to fire


async def test_slow_first_attempt_hedge_wins_and_loser_is_cancelled_with_superseded_and_awaited(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    script = Script(clock, {1: Step(1.0, "slow"), 2: Step(0.05, "fast")})
    result, at, running = await run_and_observe(clock, script, hedge(IDEMPOTENT, script, delay=0.1, label="h"))
    assert result == "fast"
    assert at == pytest.approx(0.15)
    assert running == set()  # nothing of the call still running when it returns
    assert script.cancel_messages == {1: "superseded"}
    assert [(k, n) for k, n, _ in script.log] == [
        ("start", 1), ("start", 2), ("succeeded", 2), ("cancelled", 1)]
    first, second = script.attempts
    assert (first.number, first.hedged, second.number, second.hedged) == (1, False, 2, True)
    assert first.call_id == second.call_id == first.idempotency_key
    assert sink.names == ["hedge.started", "hedge.won"]
    started, won = sink.events
    assert started.attributes == {"attempt": 2, "elapsed": pytest.approx(0.1)}
    assert won.attributes == {"attempt": 2, "started": 2, "latency": pytest.approx(0.15)}
    assert started.label == won.label == "h"


async def test_a_loser_that_ignores_cancellation_delays_the_return(clock: VirtualClock) -> None:
    script = Script(clock, {1: Step(1.0, "slow", linger=0.5), 2: Step(0.05, "fast")})
    result, at, running = await run_and_observe(clock, script, hedge(IDEMPOTENT, script, delay=0.1, label="h"))
    assert result == "fast"  # the loser's late value is not taken
    assert at == pytest.approx(0.65)  # 0.15 (win) + 0.5 the loser kept running
    assert running == set()
    assert ("lingered", 1, pytest.approx(0.65)) in script.log


async def test_the_primary_can_still_win_after_a_hedge_started(clock: VirtualClock, sink: RecordingSink) -> None:
    script = Script(clock, {1: Step(0.12, "primary"), 2: Step(1.0, "hedge")})
    result, at, running = await run_and_observe(clock, script, hedge(IDEMPOTENT, script, delay=0.1, label="h"))
    assert (result, at, running) == ("primary", pytest.approx(0.12), set())
    assert script.cancel_messages == {2: "superseded"}
    assert sink.of("hedge.won")[0].attributes == {"attempt": 1, "started": 2, "latency": pytest.approx(0.12)}


async def test_up_to_max_attempts_start_each_delay_after_the_latest(clock: VirtualClock, sink: RecordingSink) -> None:
    script = Script(clock, {1: Step(5.0, 1), 2: Step(5.0, 2), 3: Step(5.0, 3), 4: Step(0.01, 4)})
    result, at, running = await run_and_observe(
        clock, script, hedge(IDEMPOTENT, script, delay=0.1, max_attempts=3, label="h"))
    assert script.started() == [1, 2, 3]  # never a fourth
    starts = [t for k, _, t in script.log if k == "start"]
    assert starts == [pytest.approx(0.0), pytest.approx(0.1), pytest.approx(0.2)]
    assert (result, at, running) == (1, pytest.approx(5.0), set())  # attempt 1 finishes first
    assert [e.attributes["attempt"] for e in sink.of("hedge.started")] == [2, 3]
    assert set(script.cancel_messages.values()) == {"superseded"}


async def test_every_attempt_failed_raises_the_first_failure_in_completion_order(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    late, early = Boom("attempt 1"), Boom("attempt 2")
    script = Script(clock, {1: Step(0.3, error=late), 2: Step(0.1, error=early)})
    with pytest.raises(Boom) as caught:
        await clock.run(hedge(IDEMPOTENT, script, delay=0.1, label="h"))
    assert caught.value is early  # attempt 2 failed first (at 0.2), unchanged, not wrapped
    assert clock.now() == pytest.approx(0.3)
    assert script.running == set()
    assert sink.names == ["hedge.started", "hedge.attempt_failed", "hedge.attempt_failed", "hedge.all_failed"]
    failed = sink.of("hedge.attempt_failed")
    assert [e.attributes for e in failed] == [
        {"attempt": 2, "running": 1, "error.type": "Boom"},
        {"attempt": 1, "running": 0, "error.type": "Boom"},
    ]
    assert failed[0].level == stoic.Level.DEBUG


async def test_no_hedge_after_a_fast_failure(clock: VirtualClock, sink: RecordingSink) -> None:
    error = Boom("fast")
    script = Script(clock, {1: Step(0.01, error=error), 2: Step(0.01, "never")})
    with pytest.raises(Boom) as caught:
        await clock.run(hedge(IDEMPOTENT, script, delay=0.1, max_attempts=3, label="h"))
    assert caught.value is error
    assert clock.now() == pytest.approx(0.01)  # raised at once, not after the delay
    assert script.started() == [1]
    assert clock.pending_timers == 0
    # A single failing attempt is the operation's own failure: no all_failed for it.
    assert sink.names == ["hedge.attempt_failed"]


async def test_a_failure_while_others_run_keeps_hedging_on_the_timer(clock: VirtualClock) -> None:
    script = Script(clock, {1: Step(1.0, "one"), 2: Step(0.02, error=Boom()), 3: Step(0.05, "three")})
    result, at, running = await run_and_observe(
        clock, script, hedge(IDEMPOTENT, script, delay=0.1, max_attempts=3, label="h"))
    # Attempt 2 fails at 0.12; attempt 3 still waits for 0.1 after the latest start (0.2).
    assert [(k, n, t) for k, n, t in script.log if k == "start"] == [
        ("start", 1, 0.0), ("start", 2, pytest.approx(0.1)), ("start", 3, pytest.approx(0.2))]
    assert (result, at, running) == ("three", pytest.approx(0.25), set())


async def test_a_failed_hedge_then_a_primary_success_returns_the_success(clock: VirtualClock) -> None:
    script = Script(clock, {1: Step(0.3, "primary"), 2: Step(0.05, error=Boom())})
    result, at, _ = await run_and_observe(clock, script, hedge(IDEMPOTENT, script, delay=0.1, label="h"))
    assert (result, at) == ("primary", pytest.approx(0.3))


# --- the budget ---


async def test_no_token_no_hedge_and_the_running_attempt_continues(clock: VirtualClock, sink: RecordingSink) -> None:
    empty = RetryBudget(ratio=0.01, reserve_per_second=0, reserve_capacity=0)
    script = Script(clock, {1: Step(0.5, "slow"), 2: Step(0.01, "never")})
    result, at, running = await run_and_observe(
        clock, script, hedge(IDEMPOTENT, script, delay=0.1, budget=empty, label="h"))
    assert (result, at, running) == ("slow", pytest.approx(0.5), set())
    assert script.started() == [1]
    assert sink.names == ["hedge.budget_exhausted"]
    assert sink.events[0].level == stoic.Level.WARNING


async def test_a_budget_of_one_token_serves_one_hedge_across_two_calls(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    one = RetryBudget(ratio=0.01, reserve_per_second=0, reserve_capacity=1)
    policy = Hedge(0.1, budget=one, label="h")
    first = Script(clock, {1: Step(1.0, "a1"), 2: Step(0.05, "a2")})
    second = Script(clock, {1: Step(1.0, "b1"), 2: Step(0.05, "b2")})

    async def both() -> list[object]:
        return list(await asyncio.gather(policy.execute(IDEMPOTENT, first), policy.execute(IDEMPOTENT, second)))

    assert await clock.run(both()) == ["a2", "b1"]
    assert first.started() == [1, 2] and second.started() == [1]
    assert sink.names.count("hedge.started") == 1
    assert sink.names.count("hedge.budget_exhausted") == 1
    assert one.tokens == pytest.approx(0.02)  # two deposits of 0.01 remain, the token was spent


async def test_each_hedge_spends_a_token_and_each_call_deposits(clock: VirtualClock) -> None:
    budget = RetryBudget(ratio=0.5, reserve_per_second=0, reserve_capacity=0)
    policy = Hedge(0.1, budget=budget, max_attempts=3, label="h")
    for _ in range(2):  # two fast calls: 2 x 0.5 earned
        await clock.run(policy.execute(IDEMPOTENT, Script(clock, {1: Step(0.01, "x")})))
    assert budget.tokens == pytest.approx(1.0)
    slow = Script(clock, {1: Step(1.0, 1), 2: Step(1.0, 2), 3: Step(1.0, 3)})
    await clock.run(policy.execute(IDEMPOTENT, slow))
    # The third call deposited 0.5 (1.5 in all) and one hedge spent 1; 0.5 is too little for another.
    assert slow.started() == [1, 2]
    assert budget.tokens == pytest.approx(0.5)


def _tight(clock: VirtualClock) -> RetryBudget:
    """A budget of ratio 0.5 with no reserve: 20 first requests earn exactly 10 tokens."""
    return RetryBudget(ratio=0.5, reserve_per_second=0, reserve_capacity=0, clock=clock)


async def _requests_in_20_calls(clock: VirtualClock, call: Any, *, slow: bool = True) -> int:
    """How many requests a dependency receives over 20 calls of ``call(dependency)``, each failing
    with the dependency's ConnectionError (raised at once, or after 1 s on ``clock`` if ``slow``)."""
    sent = 0

    async def dependency() -> None:
        nonlocal sent
        sent += 1
        if slow:
            await clock.sleep(1)
        raise ConnectionError

    for _ in range(20):
        with pytest.raises(ConnectionError):
            await clock.run(call(dependency))
    return sent


async def test_a_retry_in_a_hedged_attempt_on_the_hedges_budget_deposits_nothing(clock: VirtualClock) -> None:
    # A retry inside the hedged operation deposited as a first attempt, though its first attempt
    # is the hedge's request: the call's own (already deposited by the hedge) or a hedge (paid
    # for with a token). With hedge and retry on one budget (a named budget per dependency)
    # each call deposited twice and each hedge earned part of its token back, so hedges plus
    # retries ran past ratio x first attempts (ratio 0.5, no reserve: 39 extra requests for 20
    # calls, where 10 are allowed).
    five = stoic.Schedule.fixed(0).attempts(5)

    def forms(shared: RetryBudget) -> list[Any]:
        async def plain(dep: Any) -> None:
            await stoic.retry(five, dep, label="r", budget=shared)

        async def timed(dep: Any) -> None:
            await stoic.retry(five, dep, label="r", budget=shared, attempt_timeout=10)

        async def stage(dep: Any) -> None:
            await stoic.Retrying(five, label="r", budget=shared).execute(dep)

        async def decorated(dep: Any) -> None:
            await stoic.retrying(five, label="r", budget=shared)(dep)()

        return [plain, timed, stage, decorated]

    for index in range(4):
        for slow in (False, True):
            shared = _tight(clock)
            form = forms(shared)[index]
            policy = Hedge(0.1, budget=shared, max_attempts=3, label="h", clock=clock)
            sent = await _requests_in_20_calls(
                clock, lambda dep, policy=policy, form=form: policy.execute(IDEMPOTENT, form, dep), slow=slow)
            # 20 first requests earn 10 tokens: hedges and retries together send at most 10 more.
            assert sent - 20 <= 10, (form.__name__, slow, sent)
            assert sent - 20 >= 9, (form.__name__, slow, sent)  # (and the tokens are used)

    # retry_sync in the first attempt (the caller's context) too.
    shared = _tight(clock)
    calls = 0

    def blocking() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError

    async def sync_form() -> None:
        stoic.retry_sync(five, blocking, label="r", budget=shared)

    with pytest.raises(ConnectionError):
        await clock.run(Hedge(0.1, budget=shared, label="h", clock=clock).execute(IDEMPOTENT, sync_form))
    assert calls == 1  # the hedge's 0.5 alone: no token for a retry

    # In a retry's attempt, a retry in the hedged operation still collapses to one attempt.
    failing = stoic.testing.fail_with(ConnectionError())
    generous = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=10, clock=clock)
    around = Hedge(0.1, budget=generous, label="h", clock=clock)

    async def hedged() -> None:
        await around.execute(IDEMPOTENT, lambda: stoic.retry(five, failing, label="inner", budget=generous))

    with pytest.raises(ConnectionError):
        await clock.run(stoic.retry(stoic.Schedule.fixed(0).attempts(2), hedged, label="outer", budget=generous))
    assert failing.calls == 2  # the outer's two attempts, one each

    # A retune keeps the rule: a hedge's budget swapped for a shared one, or its delay changed.
    for retuned in (Hedge(0.1, label="h", clock=clock), Hedge(0.1, budget=_tight(clock), label="h", clock=clock)):
        shared = _tight(clock)
        retuned._retune(budget=shared, delay=0.2)
        calls = 0
        with pytest.raises(ConnectionError):
            await clock.run(retuned.execute(IDEMPOTENT, sync_form))
        assert calls == 1

    # Token by token (ratio 1): the call deposits 1, the hedge spends it; neither attempt's retry
    # deposits on the shared budget. On a budget of its own each retry deposits as before, and
    # a retry after the call, in the caller's task or in a task an attempt left behind, too.
    whole = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=0, clock=clock)
    own = RetryBudget(ratio=0.5, reserve_per_second=0, reserve_capacity=0, clock=clock)
    left: list[asyncio.Task[None]] = []

    async def answer() -> str:
        await clock.sleep(1)
        return "ok"

    async def later() -> None:
        await clock.sleep(5)
        await stoic.retry(five, answer, label="later", budget=whole)

    async def op(attempt: stoic.Attempt) -> str:
        if attempt.number == 1:
            left.append(asyncio.get_running_loop().create_task(later()))
        await stoic.retry(five, answer, label="own", budget=own)
        return await stoic.retry(five, answer, label="r", budget=whole)

    async def call_then_retry() -> None:
        assert await Hedge(0.1, budget=whole, label="h", clock=clock).execute(IDEMPOTENT, op) == "ok"
        assert whole.tokens == pytest.approx(0.0)
        assert own.tokens == pytest.approx(1.0)  # both attempts' first requests, 0.5 each
        await stoic.retry(five, answer, label="after", budget=whole)
        assert whole.tokens == pytest.approx(1.0)
        await left[0]
        assert whole.tokens == pytest.approx(2.0)

    await clock.run(call_then_retry())


async def test_every_retry_in_a_hedged_attempt_inside_a_retry_attempt_skips_its_deposit(clock: VirtualClock) -> None:
    # A hedge running in a retry's attempt, and retries nested with ALLOW in the hedged
    # operation on the hedge's budget: only the first of them found the hedge's mark. The next
    # found the first's finished mark, whose chain runs (through the outer attempt), and
    # deposited as a retry nested in a retry attempt does, though its first attempt is the
    # hedge's request too.
    allow = stoic.RetryNesting.ALLOW
    five = stoic.Schedule.fixed(0).attempts(5)

    async def answer() -> str:
        return "ok"

    def blocking() -> str:
        return "ok"

    for form in ("plain", "timed", "sync"):
        shared = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=0, clock=clock)
        other = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=0, clock=clock)

        async def one(form: str = form, shared: RetryBudget = shared) -> str:
            if form == "sync":
                return stoic.retry_sync(five, blocking, label="r", budget=shared, nesting=allow)
            timeout = 10 if form == "timed" else None
            return await stoic.retry(five, answer, label="r", budget=shared, nesting=allow, attempt_timeout=timeout)

        async def op(one: Any = one) -> str:
            for _ in range(3):
                assert await one() == "ok"
            return "ok"

        policy = Hedge(0.1, budget=shared, label="h", clock=clock)

        async def hedged(policy: Hedge = policy, op: Any = op) -> str:
            return await policy.execute(IDEMPOTENT, op)

        assert await clock.run(stoic.retry(five, hedged, label="outer", budget=other)) == "ok"
        assert shared.tokens == pytest.approx(1.0), form  # the hedge's deposit for the call, alone
        assert other.tokens == pytest.approx(1.0), form  # (the outer retry's first attempt)


async def test_a_hedge_in_a_retry_attempt_or_a_hedge_call_on_its_budget_deposits_nothing(clock: VirtualClock) -> None:
    # The other way round from the test above: a retry around a hedge, both on one budget. The
    # retry deposited for its first attempt and the hedge deposited again for the same request,
    # and a retry's later attempts (paid for with a token) each earned part of it back through
    # the hedge's deposit. Likewise a hedge inside another hedge on one budget, and a retry on x
    # inside hedge(y) inside hedge(x).
    five = stoic.Schedule.fixed(0).attempts(5)

    def forms(shared: RetryBudget, inner: Hedge) -> list[Any]:
        async def plain(dep: Any) -> None:
            await stoic.retry(five, lambda: inner.execute(IDEMPOTENT, dep), label="r", budget=shared)

        async def timed(dep: Any) -> None:
            await stoic.retry(five, lambda: inner.execute(IDEMPOTENT, dep), label="r", budget=shared,
                              attempt_timeout=10)

        async def stage(dep: Any) -> None:
            await stoic.Retrying(five, label="r", budget=shared).execute(inner.execute, IDEMPOTENT, dep)

        async def decorated(dep: Any) -> None:
            @stoic.retrying(five, label="r", budget=shared)
            async def call() -> None:
                await inner.execute(IDEMPOTENT, dep)

            await call()

        async def in_hedge(dep: Any) -> None:
            outer = Hedge(0.1, budget=shared, max_attempts=3, label="outer", clock=clock)
            await outer.execute(IDEMPOTENT, inner.execute, IDEMPOTENT, dep)

        async def across_budgets(dep: Any) -> None:
            # hedge(x) -> hedge(y) -> retry on x: the retry's first attempt is hedge x's request.
            # (Hedge y's delay is past the dependency's answer: its own hedges, paid from y, would
            # be requests x does not bound.)
            other = Hedge(100, budget=_tight(clock), max_attempts=3, label="other", clock=clock)
            outer = Hedge(0.1, budget=shared, max_attempts=3, label="outer", clock=clock)
            await outer.execute(IDEMPOTENT, other.execute, IDEMPOTENT,
                                lambda: stoic.retry(five, dep, label="r", budget=shared))

        return [plain, timed, stage, decorated, in_hedge, across_budgets]

    for index in range(6):
        for slow in (False, True):
            shared = _tight(clock)
            inner = Hedge(0.1, budget=shared, max_attempts=3, label="h", clock=clock)
            form = forms(shared, inner)[index]
            sent = await _requests_in_20_calls(clock, form, slow=slow)
            # 20 first requests earn 10 tokens: hedges and retries together send at most 10 more.
            assert sent - 20 <= 10, (form.__name__, slow, sent)
            if form.__name__ == "in_hedge" and not slow:
                assert sent == 20  # (a quick failure starts no hedge)
            else:
                assert sent - 20 >= 9, (form.__name__, slow, sent)  # (and the tokens are used)

    # On another budget the retry and the hedge each deposit: 20 calls earn 10 retries, and the
    # 30 hedged calls they make (20 first attempts, 10 retries) earn 15 hedges.
    retries, hedges = _tight(clock), _tight(clock)
    inner = Hedge(0.1, budget=hedges, max_attempts=3, label="h", clock=clock)
    sent = await _requests_in_20_calls(
        clock, lambda dep: stoic.retry(five, lambda: inner.execute(IDEMPOTENT, dep), label="r", budget=retries))
    assert sent == 20 + 10 + 15, sent


async def test_a_collapsed_retry_between_a_retry_and_a_hedge_is_not_the_hedge_s_request(clock: VirtualClock) -> None:
    # A retry collapsed in another's attempt (SINGLE_ATTEMPT, the default) neither deposits nor
    # retries: its one attempt is the outer attempt's request, counted on the outer's budget.
    # A hedge inside it took the collapsed retry's budget for where its request was counted:
    # retry(x) > retry(y) > hedge(x) deposited on x for requests retry(x) had already counted
    # (20 extra requests for 20 calls where 10 are allowed), and retry(y) > retry(x) > hedge(x)
    # deposited nothing at all on x (no request counted there: the hedge never hedged).
    five = stoic.Schedule.fixed(0).attempts(5)

    def collapsed(inner: Hedge, on: RetryBudget, dep: Any, form: str) -> Any:
        # The collapsed retry, in each async form.
        if form == "plain":
            return stoic.retry(five, lambda: inner.execute(IDEMPOTENT, dep), label="b", budget=on)
        if form == "timed":
            return stoic.retry(five, lambda: inner.execute(IDEMPOTENT, dep), label="b", budget=on, attempt_timeout=10)
        if form == "stage":
            return stoic.Retrying(five, label="b", budget=on).execute(inner.execute, IDEMPOTENT, dep)

        @stoic.retrying(five, label="b", budget=on)
        async def call() -> None:
            await inner.execute(IDEMPOTENT, dep)

        return call()

    for form in ("plain", "timed", "stage", "decorated"):
        for hedge_on_outer in (True, False):
            x, y = _tight(clock), _tight(clock)
            inner = Hedge(0.1, budget=x, max_attempts=3, label="h", clock=clock)
            outer, middle = (x, y) if hedge_on_outer else (y, x)

            def call(dep: Any, inner: Hedge = inner, middle: RetryBudget = middle, form: str = form,
                     outer: RetryBudget = outer) -> Any:
                return stoic.retry(five, lambda: collapsed(inner, middle, dep, form), label="a", budget=outer)

            sent = await _requests_in_20_calls(clock, call)
            if hedge_on_outer:
                # As retry(x) > hedge(x): 20 first requests earn 10 tokens, for retries and hedges.
                assert sent == 30, (form, sent)
            else:
                # As retry(y) > hedge(x): 20 calls earn 10 retries on y, and the 30 hedged calls
                # they make (each a request counted on x by the hedge alone) earn 15 hedges.
                assert sent == 20 + 10 + 15, (form, sent)
            assert x.tokens == pytest.approx(0.0) and y.tokens == pytest.approx(0.0), form


async def test_a_hedge_in_the_first_attempt_of_a_retry_on_another_budget_is_the_outer_request(
    clock: VirtualClock,
) -> None:
    # A retry's first attempt is the request of the attempt, or hedge call, it started in; only
    # its later attempts are requests of its own (paid for on its budget). A hedge on x in the
    # first attempt of a retry on y, inside a retry attempt or a hedge call on x, deposited on x
    # again for a request x had already counted: retry(x) > retry(y, ALLOW, one attempt) >
    # hedge(x) sent 40 requests for 20 calls where retry(x) > hedge(x) sends 30, and hedge(x) >
    # retry(y, one attempt) > hedge(x) 59 where hedge(x) > hedge(x) sends 30.
    allow = stoic.RetryNesting.ALLOW
    one, two, five = (stoic.Schedule.fixed(0).attempts(n) for n in (1, 2, 5))

    def retried(schedule: stoic.BoundedSchedule, fn: Any, on: RetryBudget, form: str, nested: bool) -> Any:
        nesting = allow if nested else stoic.RetryNesting.SINGLE_ATTEMPT
        if form == "plain":
            return stoic.retry(schedule, fn, label="b", budget=on, nesting=nesting)
        if form == "timed":
            return stoic.retry(schedule, fn, label="b", budget=on, nesting=nesting, attempt_timeout=10)
        if form == "stage":
            return stoic.Retrying(schedule, label="b", budget=on, nesting=nesting).execute(fn)

        @stoic.retrying(schedule, label="b", budget=on, nesting=nesting)
        async def decorated() -> None:
            await fn()

        return decorated()

    for form in ("plain", "timed", "stage", "decorated"):
        for shape in ("in a retry", "in a hedge", "retrying"):
            x, y = _tight(clock), _tight(clock)
            inner = Hedge(0.1, budget=x, max_attempts=3, label="h", clock=clock)
            outer = Hedge(0.1, budget=x, max_attempts=3, label="outer", clock=clock)
            late = Hedge(100, budget=x, max_attempts=3, label="late", clock=clock)  # (only its deposit counts)

            def call(dependency: Any, shape: str = shape, form: str = form, inner: Hedge = inner,
                     outer: Hedge = outer, late: Hedge = late, x: RetryBudget = x, y: RetryBudget = y) -> Any:
                if shape == "in a retry":
                    return stoic.retry(five, lambda: retried(
                        one, lambda: inner.execute(IDEMPOTENT, dependency), y, form, True), label="a", budget=x)
                if shape == "in a hedge":
                    return outer.execute(IDEMPOTENT, lambda: retried(
                        one, lambda: late.execute(IDEMPOTENT, dependency), y, form, False))
                # The retry on y retries (ALLOW, two attempts): its second attempts are requests
                # of its own, x counts them through the hedge's deposit alone.
                return stoic.retry(five, lambda: retried(
                    two, lambda: inner.execute(IDEMPOTENT, dependency), y, form, True), label="a", budget=x)

            sent = await _requests_in_20_calls(clock, call)
            if shape == "retrying":
                # 20 calls make 20 first attempts of retry(x) (the hedges take x's tokens first),
                # which earn 10 retries on y; x earns 10 for the calls and 5 for those retries.
                assert sent == 20 + 10 + 15, (form, shape, sent)
                assert x.tokens == pytest.approx(0.0) and y.tokens == pytest.approx(0.0), (form, shape)
            else:
                # As retry(x) > hedge(x) and hedge(x) > hedge(x): 20 first requests, 10 tokens.
                assert sent == 30, (form, shape, sent)
                assert x.tokens == pytest.approx(0.0), (form, shape)


def test_the_default_budget_is_per_call_site() -> None:
    a = Hedge(0.1, label="h")
    b = Hedge(0.1, label="h")
    same = [Hedge(0.1, label="h") for _ in range(2)]
    assert a.budget is not b.budget
    assert same[0].budget is same[1].budget
    assert a.budget is not RetryBudget.PER_CALL_SITE
    shared = RetryBudget.named("backend")
    assert Hedge(0.1, budget=shared, label="h").budget is shared


async def test_hedge_function_budget_is_per_call_site_of_hedge(clock: VirtualClock) -> None:
    # A full outage of slowness: every call wants a hedge. Calls on one line share one budget,
    # whose reserve (10, refilling 1/s over the 4 s) plus 0.2 earned per call runs out.
    line_a = 0
    for _ in range(20):
        script = Script(clock, {1: Step(0.2, "a"), 2: Step(0.01, "b")})
        await clock.run(hedge(IDEMPOTENT, script, delay=0.001, label="h"))
        line_a += len(script.started()) - 1
    script = Script(clock, {1: Step(0.2, "a"), 2: Step(0.01, "b")})
    await clock.run(hedge(IDEMPOTENT, script, delay=0.001, label="h"))  # another line: its own full budget
    assert line_a < 20
    assert script.started() == [1, 2]


# --- cancellation and deadlines ---


async def test_cancelling_the_caller_cancels_and_awaits_every_attempt(clock: VirtualClock, sink: RecordingSink) -> None:
    script = Script(clock, {1: Step(1.0, 1), 2: Step(1.0, 2, linger=0.3)})
    outer = asyncio.ensure_future(hedge(IDEMPOTENT, script, delay=0.1, label="h"))
    await clock.advance(0.15)
    assert script.running == {1, 2}
    outer.cancel()
    await clock.advance(0.1)
    assert not outer.done()  # attempt 2 ignores cancellation for 0.3 s: the caller waits for it
    assert script.running == {2}
    await clock.advance(0.25)
    assert outer.cancelled()
    assert script.running == set()
    assert 1 in script.cancel_messages and script.cancel_messages[1] != "superseded"
    assert clock.pending_timers == 0
    assert "hedge.won" not in sink.names


async def test_a_second_cancellation_while_draining_still_waits_for_every_attempt(clock: VirtualClock) -> None:
    running: set[int] = set()

    async def op(attempt: stoic.Attempt) -> int:
        running.add(attempt.number)
        try:
            if attempt.number == 1:
                await clock.sleep_until(150_000_000)  # wins at 0.15
                return 1
            # The hedge refuses to stop before 0.65, however often it is cancelled.
            while clock.now_ns() < 650_000_000:
                try:
                    await clock.sleep_until(650_000_000)
                except asyncio.CancelledError:
                    pass
            return 2
        finally:
            running.discard(attempt.number)

    outer = asyncio.ensure_future(hedge(IDEMPOTENT, op, delay=0.1, label="h"))
    await clock.advance(0.2)  # attempt 1 won at 0.15; the superseded hedge is still running
    assert not outer.done() and running == {2}
    outer.cancel()
    await clock.advance(0.1)
    assert not outer.done() and running == {2}
    await clock.advance(0.4)
    assert outer.cancelled()  # cancellation is never swallowed, even with a winner in hand
    assert running == set()


async def test_a_caller_cancellation_racing_a_hedge_win_is_not_swallowed(clock: VirtualClock) -> None:
    running: set[int] = set()
    outer: asyncio.Future[int] | None = None

    async def op(attempt: stoic.Attempt) -> int:
        running.add(attempt.number)
        try:
            if attempt.number == 2:
                await clock.sleep_until(clock.now_ns() + 50_000_000)
                assert outer is not None
                outer.cancel()  # the caller is cancelled just as this hedge wins
                return 2
            await clock.sleep_until(clock.now_ns() + 1_000_000_000)
            return 1
        finally:
            running.discard(attempt.number)

    outer = asyncio.ensure_future(hedge(IDEMPOTENT, op, delay=0.1, label="h"))
    await clock.advance(0.2)
    assert outer.cancelled()
    assert running == set()


async def test_a_caller_cancellation_the_first_attempt_turns_into_an_error_is_not_swallowed(
    clock: VirtualClock,
) -> None:
    # Some client libraries turn the CancelledError they receive into an error of their own. The
    # caller was still cancelled: the hedge must stop its attempts and end the call at once, not
    # wait for a hedge to finish and hand its value to a caller that asked to stop.
    class ClientClosed(Exception):
        pass

    running: set[int] = set()

    async def op(attempt: stoic.Attempt) -> int:
        running.add(attempt.number)
        try:
            if attempt.number == 1:
                try:
                    await clock.sleep_until(1_000_000_000)
                except asyncio.CancelledError:
                    raise ClientClosed from None
                return 1
            await clock.sleep_until(clock.now_ns() + 300_000_000)
            return 2
        finally:
            running.discard(attempt.number)

    outer = asyncio.ensure_future(hedge(IDEMPOTENT, op, delay=0.1, label="h"))
    await clock.advance(0.15)
    assert running == {1, 2}
    outer.cancel()
    await clock.advance(0)
    assert outer.done()  # at once: the running hedge was cancelled, not awaited to its end
    assert running == set()
    assert isinstance(outer.exception(), ClientClosed)  # as a bare await of attempt 1 would raise
    assert clock.pending_timers == 0


async def test_a_deadline_that_leaves_less_than_the_delay_skips_the_hedge(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    script = Script(clock, {1: Step(1.0, 1), 2: Step(0.01, 2)})

    async def call() -> object:
        async with stoic.timeout(0.15):
            return await hedge(IDEMPOTENT, script, delay=0.1, label="h")

    with pytest.raises(stoic.DeadlineExceeded):
        await clock.run(call())
    assert script.started() == [1]  # at 0.1 only 0.05 was left, less than the 0.1 delay
    assert script.running == set()
    assert clock.now() == pytest.approx(0.15)
    assert sink.names == ["hedge.deadline_skip", "timeout.expired"]


async def test_a_deadline_with_room_lets_the_hedge_start(clock: VirtualClock, sink: RecordingSink) -> None:
    script = Script(clock, {1: Step(1.0, 1), 2: Step(0.01, 2)})

    async def call() -> object:
        async with stoic.timeout(0.2):
            return await hedge(IDEMPOTENT, script, delay=0.1, label="h")

    assert await clock.run(call()) == 2
    assert sink.names == ["hedge.started", "hedge.won"]


async def test_a_deadline_firing_with_hedges_running_cancels_and_awaits_them_all(clock: VirtualClock) -> None:
    script = Script(clock, {1: Step(1.0, 1), 2: Step(1.0, 2, linger=0.05), 3: Step(1.0, 3)})

    async def call() -> object:
        async with stoic.timeout(0.35):
            return await hedge(IDEMPOTENT, script, delay=0.1, max_attempts=3, budget=RetryBudget.UNLIMITED, label="h")

    with pytest.raises(stoic.DeadlineExceeded):
        await clock.run(call())
    assert script.started() == [1, 2, 3]
    assert script.running == set()
    assert clock.now() == pytest.approx(0.40)  # attempt 2 took 0.05 s to stop
    assert "superseded" not in script.cancel_messages.values()


async def test_a_deadline_firing_after_the_first_attempt_failed_still_raises_deadline_exceeded(
    clock: VirtualClock,
) -> None:
    script = Script(clock, {1: Step(0.15, error=Boom()), 2: Step(1.0, 2)})

    async def call() -> object:
        async with stoic.timeout(0.3):
            return await hedge(IDEMPOTENT, script, delay=0.1, label="h")

    with pytest.raises(stoic.DeadlineExceeded):
        await clock.run(call())
    assert script.running == set() and clock.now() == pytest.approx(0.3)


async def test_a_superseded_first_attempt_leaves_an_enclosing_timeout_intact(clock: VirtualClock) -> None:
    async def call() -> object:
        async with stoic.timeout(1.0):
            script = Script(clock, {1: Step(5.0, 1), 2: Step(0.01, 2)})
            result = await hedge(IDEMPOTENT, script, delay=0.1, label="h")  # cancels and uncancels this task
            await clock.sleep_until(clock.now_ns() + 500_000_000)  # no stray cancellation, no early deadline
        return result

    assert await clock.run(call()) == 2
    assert clock.now() == pytest.approx(0.61)

    async def late() -> object:
        async with stoic.timeout(1.0):
            script = Script(clock, {1: Step(5.0, 1), 2: Step(0.01, 2)})
            await hedge(IDEMPOTENT, script, delay=0.1, label="h")
            await clock.sleep_until(clock.now_ns() + 5_000_000_000)
        return "unreachable"

    start = clock.now()
    with pytest.raises(stoic.DeadlineExceeded):
        await clock.run(late())
    assert clock.now() - start == pytest.approx(1.0)  # the deadline still fires, on time


async def test_a_superseded_first_attempt_leaves_asyncio_timeout_and_task_groups_intact(clock: VirtualClock) -> None:
    async def one(i: int) -> object:
        script = Script(clock, {1: Step(5.0, (i, 1)), 2: Step(0.01, (i, 2))})
        async with asyncio.timeout(None):  # a stdlib timeout block around a superseded first attempt
            return await hedge(IDEMPOTENT, script, delay=0.1, budget=RetryBudget.UNLIMITED, label="h")

    async def group() -> list[object]:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(one(i)) for i in range(50)]
        return [t.result() for t in tasks]

    assert await clock.run(group()) == [(i, 2) for i in range(50)]


async def test_a_deadline_already_passed_rejects_without_running(clock: VirtualClock) -> None:
    script = Script(clock, {1: Step(0.01, 1)})

    async def call() -> object:
        async with stoic.deadline(-1.0):
            return await hedge(IDEMPOTENT, script, delay=0.1, label="h")

    with pytest.raises(stoic.DeadlineExceeded):
        await clock.run(call())
    assert script.started() == []


async def test_attempts_see_the_ambient_deadline(clock: VirtualClock) -> None:
    seen: list[float | None] = []

    async def op(attempt: stoic.Attempt) -> int:
        seen.append(stoic.time_remaining())
        await clock.sleep_until(clock.now_ns() + (500_000_000 if attempt.number == 1 else 10_000_000))
        return attempt.number

    async def call() -> int:
        async with stoic.timeout(1.0):
            return await hedge(IDEMPOTENT, op, delay=0.1, label="h")

    assert await clock.run(call()) == 2
    assert seen == [pytest.approx(1.0), pytest.approx(0.9)]


# --- shape of the API ---


async def test_idempotency_must_be_stated(clock: VirtualClock) -> None:
    script = Script(clock, {1: Step(0.01, 1)})
    with pytest.raises(TypeError, match="IDEMPOTENT"):
        await hedge("idempotent", script, delay=0.1, label="h")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await Hedge(0.1, label="h").execute(None, script)  # type: ignore[arg-type]
    assert stoic.IDEMPOTENT is stoic.Idempotency.IDEMPOTENT
    assert list(stoic.Idempotency) == [stoic.IDEMPOTENT]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"delay": -0.1}, "delay"),
        ({"delay": float("nan")}, "delay"),
        ({"delay": 0.1, "max_attempts": 1}, "max_attempts"),
        ({"delay": 0.1, "max_attempts": 0}, "max_attempts"),
        ({"delay": 0.1, "quantile": 0.0}, "quantile"),
        ({"delay": 0.1, "quantile": 1.0}, "quantile"),
        ({"delay": 0.1, "quantile": 1.5}, "quantile"),
        ({"delay": 0.1, "quantile": -0.2}, "quantile"),
        ({"delay": 0.1, "quantile": 0.9, "delay_min": 0.5, "delay_max": 0.2}, "delay_min"),
        ({"delay": 0.1, "quantile": 0.9, "delay_min": -1.0}, "delay_min"),
        ({"delay": 0.1, "delay_min": 0.01}, "quantile"),
        ({"delay": 0.1, "delay_max": 1.0}, "quantile"),
        ({"delay": 0.1, "quantile": 0.9, "window": 4}, "window"),
    ],
)
def test_invalid_configuration_is_a_value_error_naming_the_parameter(kwargs: dict[str, Any], match: str) -> None:
    delay = kwargs.pop("delay")
    with pytest.raises(ValueError, match=match):
        Hedge(delay, label="h", **kwargs)


async def test_hedge_function_validates_before_running(clock: VirtualClock) -> None:
    script = Script(clock, {1: Step(0.01, 1)})
    with pytest.raises(ValueError, match="max_attempts"):
        await hedge(IDEMPOTENT, script, delay=0.1, max_attempts=1, label="h")
    with pytest.raises(ValueError, match="delay"):
        await hedge(IDEMPOTENT, script, delay=-1, label="h")
    with pytest.raises(TypeError, match="budget"):
        await hedge(IDEMPOTENT, script, delay=0.1, budget="lots", label="h")  # type: ignore[arg-type]
    assert script.started() == []


async def test_hedge_function_at_one_line_follows_every_change_of_its_arguments(clock: VirtualClock) -> None:
    # One line called with arguments that change: each call behaves as its own arguments say
    # (the policy built at a line is reused only while the very same objects come again), and
    # an invalid argument is refused even right after valid ones.
    other = VirtualClock()
    empty = RetryBudget(ratio=0.01, reserve_capacity=0)
    unlimited = {"label": "h", "budget": RetryBudget.UNLIMITED}  # (a line's own budget would run out)
    # (error, ambient clock, arguments): each valid call differs from the previous valid one in one thing.
    cases: list[tuple[Any, VirtualClock, dict[str, Any]]] = [
        (None, clock, {"delay": 0.1}), (None, clock, {"delay": 0.1}), (None, clock, {"delay": 0.1, "max_attempts": 3}),
        (ValueError, clock, {"delay": 0.1, "max_attempts": 1}), (None, clock, {"delay": 0.05, "max_attempts": 3}),
        (ValueError, clock, {"delay": -1.0, "max_attempts": 3}),
        (None, clock, {"delay": 0.05, "max_attempts": 3, "clock": other}),
        (TypeError, clock, {"delay": 0.05, "max_attempts": 3, "clock": object()}),
        (None, clock, {"delay": 0.05, "max_attempts": 3}), (None, other, {"delay": 0.05, "max_attempts": 3}),
        (TypeError, other, {"delay": 0.05, "label": 5}), (ValueError, other, {"delay": 0.05, "label": ""}),
        (None, other, {"delay": 0.05, "max_attempts": 3, "budget": empty}),
        (TypeError, other, {"delay": 0.05, "max_attempts": 3, "budget": "lots"}),
        (None, other, {"delay": 0.05, "max_attempts": 3}),
    ]
    seen = []
    for error, ambient, kwargs in cases:
        on = kwargs.get("clock", ambient)
        script = Script(on, {1: Step(0.3, "slow"), 2: Step(0.3, "second"), 3: Step(0.01, "third")})
        with stoic.use_clock(ambient):
            if error is not None:
                with pytest.raises(error):
                    hedge(IDEMPOTENT, script, **{**unlimited, **kwargs})
                continue
            start = on.now()
            result = await on.run(hedge(IDEMPOTENT, script, **{**unlimited, **kwargs}))
        seen.append((result, script.started(), round(on.now() - start, 6)))
    assert seen == [
        ("slow", [1, 2], 0.3), ("slow", [1, 2], 0.3), ("third", [1, 2, 3], 0.21), ("third", [1, 2, 3], 0.11),
        ("third", [1, 2, 3], 0.11), ("third", [1, 2, 3], 0.11), ("third", [1, 2, 3], 0.11), ("slow", [1], 0.3),
        ("third", [1, 2, 3], 0.11)]


async def test_execute_passes_the_arguments_given_and_the_attempt_by_keyword(clock: VirtualClock) -> None:
    async def op(a: int, *, b: int, attempt: stoic.Attempt) -> tuple[int, int, int]:
        return attempt.number, a, b

    assert await clock.run(Hedge(0.1, label="h").execute(IDEMPOTENT, op, 5, b=7)) == (1, 5, 7)

    async def positional_attempt(attempt: stoic.Attempt, a: int) -> tuple[int, int]:
        return attempt.number, a

    # ``attempt`` is always passed by keyword, never as the first positional argument.
    assert await clock.run(Hedge(0.1, label="h").execute(IDEMPOTENT, positional_attempt, a=9)) == (1, 9)


async def test_an_operation_without_an_attempt_parameter_gets_exactly_its_arguments(clock: VirtualClock) -> None:
    calls: list[tuple[object, ...]] = []

    async def op(*args: object, **kwargs: object) -> int:
        calls.append((args, kwargs))
        if len(calls) == 1:
            await clock.sleep(1.0)
        return len(calls)

    policy = Hedge(0.1, label="h", budget=stoic.RetryBudget.UNLIMITED)
    assert await clock.run(policy.execute(IDEMPOTENT, op, 1, k=2)) == 2  # the hedge won
    assert calls == [((1,), {"k": 2}), ((1,), {"k": 2})]  # no Attempt, by position or keyword
    assert await clock.run(hedge(IDEMPOTENT, lambda: asyncio.sleep(0, "plain"), delay=1.0, label="h")) == "plain"


async def test_an_attempt_passed_by_the_caller_is_not_replaced(clock: VirtualClock) -> None:
    mine = stoic.Attempt(7, "mine")

    async def op(attempt: stoic.Attempt) -> int:
        return attempt.number

    assert await clock.run(Hedge(0.1, label="h").execute(IDEMPOTENT, op, attempt=mine)) == 7


@pytest.mark.parametrize("make", [
    lambda **kw: Hedge(0.1, **kw),
    lambda **kw: hedge(IDEMPOTENT, lambda: asyncio.sleep(0), delay=0.1, **kw),
])
def test_label_is_required_keyword_only_non_empty_str(make: Any) -> None:
    with pytest.raises(TypeError, match="label"):
        make()
    with pytest.raises(TypeError, match="label must be a str"):
        make(label=b"h")
    with pytest.raises(TypeError, match="label must be a str"):
        make(label=None)
    with pytest.raises(ValueError, match="label must be a non-empty str"):
        make(label="")
    with pytest.raises(TypeError):
        Hedge(0.1, 2, "h")  # type: ignore[misc]  # keyword-only


@pytest.mark.parametrize("bad", [object(), "clock", 5])
def test_a_wrong_clock_is_a_type_error_at_construction(bad: object) -> None:
    with pytest.raises(TypeError, match=r"clock must be a stoic\.Clock"):
        Hedge(0.1, label="h", clock=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"clock must be a stoic\.Clock"):
        hedge(IDEMPOTENT, lambda: asyncio.sleep(0), delay=0.1, label="h", clock=bad)  # type: ignore[arg-type]


async def test_call_ids_are_shared_within_a_call_and_unique_across_calls(clock: VirtualClock) -> None:
    ids: list[tuple[int, str]] = []

    async def op(attempt: stoic.Attempt) -> None:
        ids.append((attempt.number, attempt.call_id))
        await clock.sleep_until(clock.now_ns() + (200_000_000 if attempt.number == 1 else 1_000_000))

    policy = Hedge(0.1, budget=RetryBudget.UNLIMITED, label="h")
    for _ in range(3):
        await clock.run(policy.execute(IDEMPOTENT, op))
    assert [n for n, _ in ids] == [1, 2] * 3
    per_call = [ids[i][1] for i in (0, 2, 4)]
    assert [ids[i][1] for i in (1, 3, 5)] == per_call
    assert len(set(per_call)) == 3
    assert all(len(c) == 32 and int(c, 16) >= 0 for c in per_call)


async def test_label_is_on_every_event(clock: VirtualClock, sink: RecordingSink) -> None:
    script = Script(clock, {1: Step(1.0, 1), 2: Step(0.01, 2)})
    await clock.run(hedge(IDEMPOTENT, script, delay=0.1, label="users-api"))
    assert {e.label for e in sink.events} == {"users-api"}


async def test_explicit_clock_is_used_for_timers(sink: RecordingSink) -> None:
    virtual = VirtualClock()  # not ambient: the hedge must still run its timer on it
    script = Script(virtual, {1: Step(1.0, 1), 2: Step(0.01, 2)})
    assert await virtual.run(hedge(IDEMPOTENT, script, delay=0.1, clock=virtual, label="h")) == 2
    assert sink.of("hedge.started")[0].attributes["elapsed"] == pytest.approx(0.1)


async def test_policy_keeps_the_clock_it_was_built_with() -> None:
    virtual = VirtualClock()
    with stoic.use_clock(virtual):
        policy = Hedge(0.1, label="h")
    script = Script(virtual, {1: Step(1.0, 1), 2: Step(0.01, 2)})
    assert await virtual.run(policy.execute(IDEMPOTENT, script)) == 2


async def test_zero_delay_races_every_attempt_at_once(clock: VirtualClock) -> None:
    script = Script(clock, {1: Step(0.3, 1), 2: Step(0.2, 2), 3: Step(0.1, 3)})
    result, at, running = await run_and_observe(
        clock, script, hedge(IDEMPOTENT, script, delay=0, max_attempts=3, budget=RetryBudget.UNLIMITED, label="h"))
    assert (result, at, running) == (3, pytest.approx(0.1), set())
    assert [t for k, _, t in script.log if k == "start"] == [0.0, 0.0, 0.0]


async def test_works_on_the_system_clock() -> None:
    async def op(attempt: stoic.Attempt) -> int:
        if attempt.number == 1:
            await asyncio.sleep(10)
        return attempt.number

    assert await hedge(IDEMPOTENT, op, delay=0.001, label="h") == 2
    assert await hedge(IDEMPOTENT, lambda attempt: asyncio.sleep(0, attempt.number), delay=1.0, label="h") == 1


async def test_losers_errors_are_retrieved_and_nothing_is_left_behind(clock: VirtualClock) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))

    async def op(attempt: stoic.Attempt) -> int:
        try:
            await clock.sleep_until(clock.now_ns() + (1_000_000_000 if attempt.number == 1 else 50_000_000))
        except asyncio.CancelledError:
            raise Boom("raised while being cancelled") from None
        return attempt.number

    before = len(asyncio.all_tasks())
    assert await clock.run(hedge(IDEMPOTENT, op, delay=0.1, label="h")) == 2
    gc.collect()
    await asyncio.sleep(0)
    assert reported == []
    assert len(asyncio.all_tasks()) == before


async def test_a_function_that_is_not_async_fails_the_call_cleanly(clock: VirtualClock) -> None:
    def not_async(attempt: stoic.Attempt) -> int:
        return 1

    with pytest.raises(TypeError):
        await clock.run(hedge(IDEMPOTENT, not_async, delay=0.1, label="h"))  # type: ignore[arg-type]
    assert clock.pending_timers == 0


async def test_the_current_task_is_not_left_with_a_cancel_request(clock: VirtualClock) -> None:
    async def call() -> tuple[object, int]:
        script = Script(clock, {1: Step(1.0, 1), 2: Step(0.01, 2)})
        result = await hedge(IDEMPOTENT, script, delay=0.1, label="h")  # the first attempt is superseded
        task = asyncio.current_task()
        assert task is not None
        await clock.sleep_until(clock.now_ns() + 10_000_000)  # no stray cancellation arrives
        return result, task.cancelling()

    assert await clock.run(call()) == (2, 0)


async def test_a_sink_that_raises_never_breaks_the_call(clock: VirtualClock) -> None:
    class Broken:
        level = stoic.Level.DEBUG

        def emit(self, event: stoic.Event) -> None:
            raise RuntimeError("sink down")

    script = Script(clock, {1: Step(1.0, 1), 2: Step(0.01, 2)})
    with stoic.use_sinks(Broken()):
        assert await clock.run(hedge(IDEMPOTENT, script, delay=0.1, label="h")) == 2


async def test_three_hundred_concurrent_hedged_calls_leave_nothing_running(clock: VirtualClock) -> None:
    policy = Hedge(0.05, max_attempts=3, budget=RetryBudget.UNLIMITED, label="h")
    scripts = [
        Script(clock, {n: Step(((i * 7 + n * 13) % 17) / 100 + 0.001, (i, n),
                               error=Boom() if (i + n) % 5 == 0 else None) for n in (1, 2, 3)})
        for i in range(300)
    ]

    async def one(script: Script) -> object:
        try:
            result = await policy.execute(IDEMPOTENT, script)
        except Boom:
            result = "failed"
        assert script.running == set()
        return result

    async def everything() -> list[object]:
        return list(await asyncio.gather(*(one(s) for s in scripts)))

    results = await clock.run(everything())
    assert len(results) == 300
    assert sum(1 for r in results if r == "failed") > 0
    assert all(s.running == set() for s in scripts)
    assert clock.pending_timers == 0


def test_a_hedge_driven_outside_any_task_never_borrows_another_threads_task() -> None:
    # While another thread's loop is inside a task's step, that task is the only entry in
    # asyncio's running-task table; a hedge driven by hand on this thread (no loop, no task)
    # must refuse, as it does with no other loop running, not schedule its timer on that loop.
    import threading
    import time

    inside, leave = threading.Event(), threading.Event()

    async def holds_its_step() -> None:
        inside.set()
        while not leave.is_set():
            time.sleep(0.001)  # (blocking on purpose: the task stays the running entry)

    other = threading.Thread(target=asyncio.run, args=(holds_its_step(),))
    other.start()
    try:
        assert inside.wait(10)
        calls: list[int] = []

        async def op() -> int:
            calls.append(1)
            return 1

        driven = Hedge(delay=0.01, label="h").execute(IDEMPOTENT, op)
        with pytest.raises(RuntimeError):
            driven.send(None)
        assert calls == []
    finally:
        leave.set()
        other.join(10)
    assert not other.is_alive()


# --- KeyboardInterrupt, SystemExit and the like from any attempt stop the call ----------------

class Stop(BaseException):
    """A BaseException that is not an Exception (as KeyboardInterrupt and SystemExit are), which
    asyncio does not re-raise out of the event loop, so it can be used inside a test's loop."""


async def test_an_interrupt_in_a_hedge_stops_the_call_and_cancels_the_first_attempt(
    clock: VirtualClock, sink: RecordingSink,
) -> None:
    # Seen failing before the fix: the interrupt was recorded as attempt 2's failure and the
    # first attempt's value returned at 1 s, the interrupt swallowed.
    stop = Stop()
    script = Script(clock, {1: Step(1.0, "slow"), 2: Step(0.05, error=stop)})

    async def observed() -> None:
        try:
            await hedge(IDEMPOTENT, script, delay=0.1, label="h")
        finally:
            assert script.running == set()  # every attempt had stopped when the call ended

    with pytest.raises(Stop) as caught:
        await clock.run(observed())
    assert caught.value is stop
    assert clock.now() == pytest.approx(0.15)  # at once, not when the first attempt would end
    assert ("cancelled", 1, pytest.approx(0.15)) in script.log
    assert sink.names == ["hedge.started"]  # no attempt_failed / all_failed: nothing failed
    assert clock.pending_timers == 0


async def test_an_interrupt_in_a_hedge_after_the_first_attempt_failed_is_raised_not_the_failure(
    clock: VirtualClock, sink: RecordingSink,
) -> None:
    stop = Stop()
    script = Script(clock, {1: Step(0.15, error=Boom("down")), 2: Step(0.1, error=stop)})
    with pytest.raises(Stop) as caught:
        await clock.run(hedge(IDEMPOTENT, script, delay=0.1, label="h"))
    assert caught.value is stop
    assert clock.now() == pytest.approx(0.2)
    # Attempt 1 did fail (reported); attempt 2 was interrupted (not reported as failed), and
    # no hedge.all_failed claims the call failed with Boom.
    assert sink.names == ["hedge.started", "hedge.attempt_failed"]
    assert sink.of("hedge.attempt_failed")[0].attributes["attempt"] == 1


async def test_an_interrupt_in_a_third_attempt_cancels_both_others(clock: VirtualClock, sink: RecordingSink) -> None:
    stop = Stop()
    script = Script(clock, {1: Step(5.0, "one"), 2: Step(5.0, "two"), 3: Step(0.01, error=stop)})
    with pytest.raises(Stop) as caught:
        await clock.run(Hedge(0.1, max_attempts=3, label="h3").execute(IDEMPOTENT, script))
    assert caught.value is stop
    assert script.running == set()
    assert set(script.cancel_messages) == {1, 2}
    assert [e.name for e in sink.events] == ["hedge.started", "hedge.started"]


async def test_a_loser_interrupted_instead_of_cancelled_is_raised_as_the_first_attempt_would_be(
    clock: VirtualClock, sink: RecordingSink,
) -> None:
    stop = Stop()

    async def op(attempt: stoic.Attempt) -> str:
        if attempt.number == 1:
            await clock.sleep(0.12)
            return "primary"
        try:
            await clock.sleep(1.0)
        except asyncio.CancelledError:
            raise stop from None
        return "hedge"

    with pytest.raises(Stop) as caught:
        await clock.run(hedge(IDEMPOTENT, op, delay=0.1, label="h"))
    assert caught.value is stop
    assert "hedge.won" not in sink.names and "hedge.attempt_failed" not in sink.names


async def test_an_interrupt_inside_a_group_from_a_hedge_stops_the_call(clock: VirtualClock) -> None:
    group = BaseExceptionGroup("fan-out", [Boom("one"), Stop()])
    script = Script(clock, {1: Step(1.0, "slow"), 2: Step(0.05, error=group)})
    with pytest.raises(BaseExceptionGroup) as caught:
        await clock.run(hedge(IDEMPOTENT, script, delay=0.1, label="h"))
    assert caught.value is group
    assert script.running == set()


def test_a_keyboard_interrupt_in_a_hedge_propagates_unchanged_from_the_call() -> None:
    # asyncio re-raises a KeyboardInterrupt out of the loop from the task that raised it (the
    # hedge's), so the test runs its own loop: once resumed, the call stops every attempt and
    # raises that same interrupt, reporting no attempt as failed.
    clock = VirtualClock()
    interrupt = KeyboardInterrupt()
    sink = RecordingSink()
    progress: list[str] = []

    async def op(attempt: stoic.Attempt) -> str:
        if attempt.number == 2:
            await clock.sleep(0.05)
            raise interrupt
        try:
            await clock.sleep(10.0)
        except asyncio.CancelledError:
            progress.append("first attempt cancelled")
            raise
        return "slow"

    async def call() -> str:
        with stoic.use_sinks(sink):
            return await hedge(IDEMPOTENT, op, delay=0.1, label="h", clock=clock)

    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(call())

        async def drive() -> None:
            while not task.done():
                await clock.advance(0.05)

        driver = loop.create_task(drive())
        with pytest.raises(KeyboardInterrupt):  # out of the hedge task's step, by asyncio
            loop.run_until_complete(driver)
        with pytest.raises(KeyboardInterrupt):  # out of the caller's task: the call raised it
            loop.run_until_complete(driver)
        assert task.done() and task.exception() is interrupt
        loop.run_until_complete(driver)
        assert progress == ["first attempt cancelled"]
        assert sink.names == ["hedge.started"]
        assert asyncio.all_tasks(loop) == set()
    finally:
        loop.close()


async def test_a_hedge_whose_operation_raises_when_called_is_that_attempts_failure(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    # A plain function building its coroutine may raise for one attempt (a request it cannot
    # sign, say): that attempt failed, as the first attempt's would have; the timer goes on,
    # and it is not an error escaping the hedge timer's callback.
    made: list[int] = []

    def op(attempt: stoic.Attempt) -> Any:
        made.append(attempt.number)
        if attempt.number == 2:
            raise Boom("cannot build the request")

        async def send() -> int:
            await clock.sleep(1.0 if attempt.number == 1 else 0.05)
            return attempt.number

        return send()

    policy = Hedge(0.1, label="h", max_attempts=3, clock=clock)
    assert await clock.run(policy.execute(IDEMPOTENT, op)) == 3
    assert made == [1, 2, 3]
    assert clock.now() == pytest.approx(0.25)
    assert sink.names == ["hedge.started", "hedge.attempt_failed", "hedge.started", "hedge.won"]
    assert sink.of("hedge.attempt_failed")[0].attributes == {"attempt": 2, "running": 1, "error.type": "Boom"}


async def test_a_hedge_whose_operation_returns_another_awaitable_runs_it_as_the_first_attempt_would(
    clock: VirtualClock,
) -> None:
    def op(attempt: stoic.Attempt) -> Any:
        future = asyncio.get_running_loop().create_future()
        clock.call_at(clock.now_ns() + (10**9 if attempt.number == 1 else 5 * 10**7),
                      lambda: future.done() or future.set_result(attempt.number))
        return future

    assert await clock.run(Hedge(0.1, label="h", clock=clock).execute(IDEMPOTENT, op)) == 2


async def test_a_hedged_call_closed_while_its_first_attempt_runs_closes_cleanly_and_cancels_the_hedges(
    clock: VirtualClock,
) -> None:
    # coro.close() (or the collection of a suspended call) throws GeneratorExit into the first
    # attempt: the call may not await again, so the hedges are cancelled and the close succeeds
    # (it raised RuntimeError "coroutine ignored GeneratorExit", awaiting the hedges).
    seen: list[tuple[int, str]] = []

    async def op(attempt: stoic.Attempt) -> None:
        try:
            await clock.sleep(10)
        except BaseException as error:
            seen.append((attempt.number, type(error).__name__))
            raise

    call = Hedge(1, label="h", clock=clock).execute(IDEMPOTENT, op)
    call.__await__().send(None)  # the first attempt is waiting, in this task
    await clock.advance(2)  # the hedge starts
    await settle_tasks()
    call.close()
    await settle_tasks()
    assert seen == [(1, "GeneratorExit"), (2, "CancelledError")]
    assert others() == []


async def test_a_hedged_call_closed_while_waiting_for_its_hedges_cancels_them(clock: VirtualClock) -> None:
    seen: list[tuple[int, str]] = []

    async def op(attempt: stoic.Attempt) -> None:
        if attempt.number == 1:
            await clock.sleep(1.5)
            raise Boom("first")
        try:
            await clock.sleep(10)
        except BaseException as error:
            seen.append((attempt.number, type(error).__name__))
            raise

    call = Hedge(1, label="h", clock=clock).execute(IDEMPOTENT, op)
    steps = call.__await__()
    steps.send(None)
    await clock.advance(2)  # the hedge starts at 1; the first attempt's sleep ends at 1.5
    steps.send(None)  # the first attempt fails: the call waits for the hedge
    call.close()
    await settle_tasks()
    assert seen == [(2, "CancelledError")]  # not left running once the call is gone
    assert others() == []


def others() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task is not asyncio.current_task() and not task.done()]


async def settle_tasks() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_hedges_events_reach_the_sinks_in_scope_at_the_call_whoever_moves_the_clock(
        clock: VirtualClock) -> None:
    # The hedge timer fires in the call's context, as on the system clock: hedge.started goes to
    # the sink scoped around the call, not to one scoped around the code advancing time.
    inside, outside = RecordingSink(), RecordingSink()
    script = Script(clock, {1: Step(1.0, "slow"), 2: Step(0.05, "fast")})

    async def call() -> object:
        with stoic.use_sinks(inside):
            return await hedge(IDEMPOTENT, script, delay=0.1, label="scoped")

    task = asyncio.ensure_future(call())
    await stoic.testing.settle()
    with stoic.use_sinks(outside):
        await clock.advance(0.2)
    assert await task == "fast"
    assert inside.names == ["hedge.started", "hedge.won"]
    assert outside.events == []


class _Interrupt(BaseException):
    """Not an Exception: what a sink is interrupted by (Ctrl-C landing in its write)."""


async def test_a_sink_interrupted_on_a_hedges_failure_still_lets_the_call_end(clock: VirtualClock) -> None:
    # A hedge's end is judged in its task's done callback, which reported the failure before
    # recording it: a sink raising a BaseException there (stoic skips a sink's Exception) ended
    # the callback, the first attempt (failed already) was never woken, and the call hung.
    class InterruptedSink:
        level = stoic.Level.DEBUG

        def emit(self, event: stoic.Event) -> None:
            if event.name == "hedge.attempt_failed" and event.attributes["attempt"] == 2:
                raise _Interrupt(event.name)

    async def op(attempt: stoic.Attempt) -> None:
        await clock.sleep(0.002 if attempt.number == 1 else 0.004)
        raise ConnectionError(f"attempt {attempt.number}")

    policy = Hedge(0.001, label="h", clock=clock)
    with stoic.use_sinks(InterruptedSink()):
        call = asyncio.ensure_future(policy.execute(IDEMPOTENT, op))
        for _ in range(100):
            await clock.advance(0.001)
            if call.done():
                break
    assert call.done()
    with pytest.raises(ConnectionError, match="attempt 1"):
        call.result()
