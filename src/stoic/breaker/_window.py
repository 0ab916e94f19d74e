"""The breaker's rolling windows: the exact last N calls, or the last T in ten buckets.

Seed 000, "The window" and "Judging". Each window keeps running totals so that recording a
call and judging the thresholds are O(1); rates are compared in integer parts per million,
never by floating-point division. Not thread-safe: the breaker calls them under its lock.

Successes can also be added in a batch (:meth:`successes`): once a window holds
``minimum_calls`` a success can only lower both rates until older calls age out, so the
breaker may count quick successes without taking its lock and fold them in later
(:meth:`defer_until` says until when that is safe).
"""

from __future__ import annotations

from array import array

FAILED = 1
"""Outcome bit: recorded as a failure."""
SLOW = 2
"""Outcome bit: took longer than ``slow_call_duration``."""

PPM = 1_000_000
# Beyond any instant a clock can reach: a VirtualClock may start at MAX_SECONDS (10**21 ns, past
# 2**62), and a breaker's instants add durations of up to as much again.
NEVER = -(1 << 100)  # an instant before any clock reading
FOREVER = 1 << 100  # an instant after any clock reading
_EMPTY = 255  # a count-window slot that has never held a call
# TimeBuckets' counts, all 0 (three per bucket, ten buckets): 32-bit, since a bucket that holds
# 2**32 calls is one of hours at millions of calls a second; past that they widen to 64 bits.
_NO_COUNTS = array("I", bytes(array("I").itemsize * 3 * 10))


def judge(calls: int, failures: int, slow: int, minimum: int, failure_ppm: int, slow_ppm: int) -> str | None:
    """The trigger when ``calls`` (>= ``minimum``) are over a threshold, else ``None``."""
    if calls < minimum:
        return None
    if failures * PPM >= failure_ppm * calls:
        return "failure_rate"
    if slow * PPM >= slow_ppm * calls:
        return "slow_calls"
    return None


class CountRing:
    """The last ``size`` calls exactly, as a ring of outcome codes (one byte per call)."""

    __slots__ = ("_fppm", "_i", "_minimum", "_ring", "_size", "_sppm", "calls", "failures", "slow")

    def __init__(self, size: int, minimum_calls: int, failure_ppm: int, slow_ppm: int) -> None:
        self._minimum = minimum_calls
        self._fppm = failure_ppm
        self._sppm = slow_ppm
        self._size = size
        self.clear()

    def clear(self) -> None:
        self._ring = bytearray([_EMPTY]) * self._size
        self._i = 0
        self.calls = self.failures = self.slow = 0

    def counts(self, now_ns: int) -> tuple[int, int, int]:
        """(calls, failures, slow calls) in the window at ``now_ns``."""
        return self.calls, self.failures, self.slow

    def tripped(self) -> str | None:
        return judge(self.calls, self.failures, self.slow, self._minimum, self._fppm, self._sppm)

    def add(self, now_ns: int, code: int) -> bool:
        """Record one call's outcome ``code`` (FAILED|SLOW bits); True when a threshold is reached."""
        ring = self._ring
        i = self._i
        old = ring[i]
        ring[i] = code
        i += 1
        self._i = 0 if i == self._size else i
        if old == _EMPTY:
            self.calls += 1
        elif old:
            if old & FAILED:
                self.failures -= 1
            if old & SLOW:
                self.slow -= 1
        if code & FAILED:
            self.failures += 1
        if code & SLOW:
            self.slow += 1
        calls = self.calls
        return calls >= self._minimum and (
            self.failures * PPM >= self._fppm * calls or self.slow * PPM >= self._sppm * calls
        )

    def success(self, now_ns: int) -> bool:
        """Record one success that was not slow; True when a threshold is reached."""
        return self.add(now_ns, 0)

    def successes(self, count: int) -> bool:
        """Record ``count`` successes that were not slow; True when a threshold is reached.

        Evicts the ``count`` oldest slots in bulk. Both rates can only fall, except when the
        batch brings the window to ``minimum_calls``, which is judged in full.
        """
        size = self._size
        before = self.calls
        ring = self._ring
        if count >= size:
            self._ring = bytearray(size)
            self._i = 0
            self.calls, self.failures, self.slow = size, 0, 0
        else:
            i = self._i
            end = i + count
            spans = ((i, end),) if end <= size else ((i, size), (0, end - size))
            for a, b in spans:
                part = ring[a:b]
                both = part.count(FAILED | SLOW)
                self.calls += part.count(_EMPTY)
                self.failures -= part.count(FAILED) + both
                self.slow -= part.count(SLOW) + both
                ring[a:b] = bytes(b - a)
            self._i = end % size
        return before < self._minimum and self.tripped() is not None

    def defer_until(self) -> int:
        """Until when successes may be batched without changing a decision: forever, once the
        window holds ``minimum_calls``."""
        return FOREVER if self.calls >= self._minimum else NEVER


class TimeBuckets:
    """The calls of the last ten buckets of ``bucket_ns`` (the current one included).

    A call lands in bucket ``end_ns // bucket_ns``, so the window spans between nine and ten
    bucket lengths. The current bucket's counts are plain integers (one increment per call);
    the nine before it are summed once, when time reaches a new bucket. A completion stamped
    earlier than the current bucket (a slower thread finishing late) counts in the current one.

    The buckets' counts are one 32-bit ``array`` of calls, failures and slow calls (ten slots
    each), widened to 64 bits by the first count past 2**32 - 1: three lists held an int
    object per slot once counts passed 256, about 690 B a busy breaker against 184 B (a
    breaker per tenant pays this for every tenant).
    """

    __slots__ = (
        "_bucket_ns", "_counts", "_cur_calls", "_cur_failures", "_cur_slow", "_fppm", "_head", "_head_end",
        "_judge_at", "_minimum", "_old_calls", "_old_failures", "_old_slow", "_sppm",
    )

    _N = 10

    def __init__(self, bucket_ns: int, minimum_calls: int, failure_ppm: int, slow_ppm: int) -> None:
        self._minimum = minimum_calls
        self._fppm = failure_ppm
        self._sppm = slow_ppm
        self._bucket_ns = bucket_ns
        self.clear()

    def clear(self) -> None:
        # Per bucket j: calls at j, failures at N + j, slow calls at 2N + j (the current bucket's
        # slots kept at 0: its counts are the _cur_ integers).
        self._counts = array("I", _NO_COUNTS)
        self._head: int | None = None  # the current bucket's number (end_ns // bucket_ns)
        self._head_end = NEVER  # first instant past the current bucket; NEVER: judge in full next
        self._cur_calls = self._cur_failures = self._cur_slow = 0
        self._old_calls = self._old_failures = self._old_slow = 0
        self._judge_at = self._minimum

    def _roll(self, now_ns: int) -> None:
        """Make the bucket of ``now_ns`` current (or re-derive the sums for the same bucket)."""
        epoch = now_ns // self._bucket_ns
        head = self._head
        if head is None:  # cleared: every slot, count and sum is already 0
            self._head = epoch
            self._head_end = (epoch + 1) * self._bucket_ns
            return
        n = self._N
        counts = self._counts
        if epoch < head:
            epoch = head  # a late completion from before the current bucket
        j = head % n
        try:
            counts[j], counts[n + j], counts[2 * n + j] = self._cur_calls, self._cur_failures, self._cur_slow
        except OverflowError:  # a bucket of more than 2**32 - 1 calls: widen, once
            counts = self._counts = array("q", counts)
            counts[j], counts[n + j], counts[2 * n + j] = self._cur_calls, self._cur_failures, self._cur_slow
        if epoch - head >= n:
            counts = self._counts = array("I", _NO_COUNTS)  # (every bucket has aged out)
        else:
            for k in range(head + 1, epoch + 1):
                j = k % n
                counts[j] = counts[n + j] = counts[2 * n + j] = 0
        j = epoch % n
        self._cur_calls, self._cur_failures, self._cur_slow = counts[j], counts[n + j], counts[2 * n + j]
        counts[j] = counts[n + j] = counts[2 * n + j] = 0
        self._old_calls, self._old_failures, self._old_slow = (
            sum(counts[:n]), sum(counts[n:2 * n]), sum(counts[2 * n:]))
        self._head = epoch
        self._head_end = (epoch + 1) * self._bucket_ns
        self._judge_at = self._minimum - self._old_calls

    def counts(self, now_ns: int) -> tuple[int, int, int]:
        """(calls, failures, slow calls) in the window at ``now_ns`` (ages out old buckets)."""
        if now_ns >= self._head_end:
            self._roll(now_ns)
            # Old successes may have aged out unjudged: the next success is judged in full.
            self._head_end = NEVER
        return (
            self._old_calls + self._cur_calls,
            self._old_failures + self._cur_failures,
            self._old_slow + self._cur_slow,
        )

    def tripped(self) -> str | None:
        return judge(
            self._old_calls + self._cur_calls, self._old_failures + self._cur_failures,
            self._old_slow + self._cur_slow, self._minimum, self._fppm, self._sppm,
        )

    def add(self, now_ns: int, code: int) -> bool:
        """Record one call that ended at ``now_ns``; True when a threshold is reached."""
        if now_ns >= self._head_end:
            self._roll(now_ns)
        self._cur_calls += 1
        if code & FAILED:
            self._cur_failures += 1
        if code & SLOW:
            self._cur_slow += 1
        return self.tripped() is not None

    def success(self, now_ns: int) -> bool:
        """Record a success that was not slow; True when a threshold is reached."""
        if now_ns >= self._head_end:
            return self.add(now_ns, 0)
        calls = self._cur_calls + 1
        self._cur_calls = calls
        return calls == self._judge_at and self.tripped() is not None

    def successes(self, count: int) -> bool:
        """Record ``count`` quick successes in the current bucket (they were deferred while it
        was current); True when a threshold is reached."""
        before = self._old_calls + self._cur_calls
        self._cur_calls += count
        if before < self._minimum or self._head_end == NEVER:
            return self.tripped() is not None
        return False

    def defer_until(self) -> int:
        """Until when successes may be batched without changing a decision: the end of the
        current bucket, once the window holds ``minimum_calls``."""
        if self._old_calls + self._cur_calls >= self._minimum:
            return self._head_end
        return NEVER
