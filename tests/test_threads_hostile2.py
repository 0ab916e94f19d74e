"""Hostile tests of the blocking (threaded) policies under contention."""

from __future__ import annotations

import threading

from _threads import eventually, process_wide_sink  # noqa: F401  (the process-wide `sink` fixture)

from stoic import DeadlineExceeded
from stoic.bulkhead import BlockingBulkhead
from stoic.testing import RecordingSink, VirtualClock

SECOND_NS = 1_000_000_000


def test_waiters_timing_out_after_a_lower_queue_limit_is_retuned_fail_with_deadline_exceeded(
        sink: RecordingSink) -> None:
    # Seen failing before the fix: a waiter that had queued (there was room then) judged its
    # time-out by the queue limit as it stood at wake: after a retune lowered it below the
    # waiter's place, the waiter that had waited its whole timeout was told BulkheadFull (and
    # bulkhead.rejected said bulkhead_full) instead of DeadlineExceeded.
    clock = VirtualClock()
    bulkhead = BlockingBulkhead(1, queue_limit=100, label="retuned", clock=clock)
    bulkhead.acquire()
    outcomes: list[BaseException | None] = []
    lock = threading.Lock()

    def wait() -> None:
        try:
            bulkhead.acquire(timeout=1.0)
            outcome: BaseException | None = None
        except BaseException as exc:
            outcome = exc
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=wait, daemon=True) for _ in range(50)]
    for thread in threads:
        thread.start()
    try:
        eventually(lambda: bulkhead.queued_count == 50)
        bulkhead._retune(queue_limit=1)  # the waiters keep their places
        clock._set_now(2 * SECOND_NS)
        for thread in threads:
            thread.join(5)
        assert len(outcomes) == 50
        assert [type(o) for o in outcomes] == [DeadlineExceeded] * 50
        reasons = [e.attributes["reason"] for e in sink.of("bulkhead.rejected")]
        assert reasons == ["deadline_exceeded"] * 50
        assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    finally:
        bulkhead.release()
        for thread in threads:
            thread.join(5)
    assert bulkhead.active_count == 0
