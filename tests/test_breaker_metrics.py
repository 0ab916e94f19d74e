"""Metrics as state (issue 11, item 1): with metrics enabled the breaker counts every call by
outcome and error.type, and observes its duration, exactly, into its own recorder."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
from _breaker_helpers import Boom, StepClock

from stoic import BulkheadFull, CircuitBreaker, CountWindow, _metrics

MS = 1_000_000


def _calls(recorder: Any) -> dict[tuple[str, ...], int]:
    """Calls by (outcome, error.type): stoic.breaker.calls is the duration histogram's count."""
    return {key[1:]: h.count for key, h in recorder.histograms.items()
            if key[0] == "stoic.breaker.call.duration" and h.count}

def _recorder_of(breaker: CircuitBreaker) -> _metrics.Recorder:
    recorder = breaker._recorder
    assert recorder is not None
    assert (recorder.kind, recorder.label) == ("breaker", breaker.label)
    return recorder


def test_no_recorder_is_made_while_metrics_are_off() -> None:
    breaker = CircuitBreaker(label="quiet")
    for _ in range(50):
        breaker.call(lambda: 1)
    assert breaker._recorder is None


def test_every_call_is_counted_by_outcome_and_error_type(metrics_on: None) -> None:
    clock = StepClock()
    breaker = CircuitBreaker(label="api", window=CountWindow(1000), minimum_calls=1, failure_rate_threshold=1.0,
                             clock=clock)  # type: ignore[arg-type]

    def ok() -> int:
        clock.t += 3 * MS
        return 1

    def refused() -> None:
        clock.t += 20 * MS
        raise ConnectionError("refused")

    def full() -> None:
        raise BulkheadFull(label="inner")

    for _ in range(300):  # far more than would ever be folded in one go
        breaker.call(ok)
    for _ in range(7):
        with pytest.raises(ConnectionError):
            breaker.call(refused)
    with pytest.raises(BulkheadFull):
        breaker.call(full)  # ignored: not a call of the dependency
    recorder = _recorder_of(breaker)
    assert _calls(recorder) == {("success", ""): 300, ("failure", "ConnectionError"): 7}
    success = recorder.histograms[("stoic.breaker.call.duration", "success", "")]
    failure = recorder.histograms[("stoic.breaker.call.duration", "failure", "ConnectionError")]
    assert (success.count, success.sum_ns) == (300, 300 * 3 * MS)
    assert success.counts[0] == 300  # 3 ms <= 5 ms, the first bucket
    assert (failure.count, failure.sum_ns) == (7, 7 * 20 * MS)
    assert failure.counts[2] == 7  # 20 ms: in (10 ms, 25 ms]
    assert breaker.snapshot.calls == 307


async def test_the_async_paths_record_alike(metrics_on: None) -> None:
    breaker = CircuitBreaker(label="async", window=CountWindow(100), minimum_calls=50)

    @breaker
    async def decorated() -> int:
        return 1

    async def plain() -> int:
        return 2

    async def fails() -> None:
        raise Boom("x")

    for _ in range(20):
        await decorated()
        await breaker.execute(plain)
    with pytest.raises(Boom):
        await breaker.execute(fails)
    assert _calls(_recorder_of(breaker)) == {("success", ""): 40, ("failure", "Boom"): 1}


def test_threads_are_counted_exactly(metrics_on: None) -> None:
    breaker = CircuitBreaker(label="threads", window=CountWindow(100), minimum_calls=100)
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for _ in range(2000):
            breaker.call(int)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    recorder = _recorder_of(breaker)
    assert _calls(recorder) == {("success", ""): 16_000}
    assert recorder.histograms[("stoic.breaker.call.duration", "success", "")].count == 16_000


def test_a_collected_breaker_takes_its_recorder_with_it(metrics_on: None) -> None:
    breaker = CircuitBreaker(label="tenant-42")
    breaker.call(int)
    assert any(r.label == "tenant-42" for r in _metrics.recorders())
    del breaker
    gc.collect()
    assert not any(r.label == "tenant-42" for r in _metrics.recorders())


def test_threads_racing_to_make_the_recorder_make_one(metrics_on: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # A rejection counts outside the breaker's lock and a call under it: both may make the
    # recorder at once. Each making thread is held inside until the other has had time to
    # arrive, so without the guard both would make one and the success histogram kept at hand
    # could belong to the recorder that was dropped.
    breaker = CircuitBreaker(label="raced")
    made: list[_metrics.Recorder] = []
    real = _metrics.recorder
    both = threading.Barrier(2, timeout=0.3)

    def slow_recorder(*args: Any, **kwargs: Any) -> _metrics.Recorder:
        try:
            both.wait()
        except threading.BrokenBarrierError:
            pass  # (the other thread is waiting for the guard: the expected case)
        recorder = real(*args, **kwargs)
        made.append(recorder)
        return recorder

    monkeypatch.setattr(_metrics, "recorder", slow_recorder)
    threads = [threading.Thread(target=breaker._new_recorder) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(made) == 1
    recorder = _recorder_of(breaker)
    assert breaker._success_histogram is recorder.histograms[("stoic.breaker.call.duration", "success", "")]


async def test_a_call_refused_for_its_passed_deadline_counts_as_a_rejection(metrics_on: None) -> None:
    # Seen failing before the fix: breaker.rejected (reason deadline_exceeded) was emitted but
    # stoic.breaker.rejections, "every call the breaker refused", did not count it, where the
    # limiter and the bulkhead count their own late refusals.
    import asyncio

    import stoic

    breaker = CircuitBreaker(label="late")
    breaker.call(lambda: 1)

    async def ok() -> int:
        return 1

    async def late() -> None:
        async with stoic.deadline(stoic.SYSTEM_CLOCK.now() - 1):
            await breaker.execute(ok)

    for _ in range(3):
        with pytest.raises(stoic.DeadlineExceeded):
            await late()
    await asyncio.sleep(0)
    assert _recorder_of(breaker).counters.get(("stoic.breaker.rejections", "closed")) == 3
