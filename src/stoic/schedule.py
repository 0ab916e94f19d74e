"""Schedules: when to try again, as data (seed 001, "Schedules are data", "Bounded by type").

A :class:`Schedule` is an immutable tree of small frozen nodes. It does nothing by itself: a
*stepper* built from it answers, once per failed attempt, "wait this long and go again" or
"stop". Because it is data, a schedule prints as the code that builds it, compares and hashes by
structure, reports its worst case, and steps the same way in a test as in production.

``retry`` accepts only a :class:`BoundedSchedule`, and the only ways to make one are
:meth:`Schedule.attempts` and :meth:`Schedule.delays` (and combining bounded schedules, which
keeps the bound). Delays are integer nanoseconds inside and float seconds outside; arithmetic
saturates (an exponential at attempt 1,000,000 is just its cap), so nothing ever overflows.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, TypeAlias, TypeVar, overload

from ._durations import Seconds, _finite, _show, check_fraction, check_int, to_ns

__all__ = ["BoundedSchedule", "Schedule"]

MAX_NS = 2**63 - 1
"""Every delay saturates here (about 292 years): nothing is ever larger, nothing overflows."""

DEFAULT_CAP_NS = 300 * 1_000_000_000
"""Exponential and Fibonacci schedules are capped at five minutes unless ``capped`` says otherwise."""

_S = TypeVar("_S", bound="Schedule")


def _ns(value: Seconds, name: str, *, allow_zero: bool = False) -> int:
    """A validated duration (``ValueError``/``TypeError`` naming ``name``: stoic's one range,
    so ``Schedule.fixed(10**300)`` is refused at once), saturating at ``MAX_NS`` (292 years)."""
    return min(MAX_NS, to_ns(value, name, allow_zero=allow_zero))


# --- the nodes -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Fixed:
    delay: int


@dataclass(frozen=True, slots=True)
class _Linear:
    step: int


@dataclass(frozen=True, slots=True)
class _Exponential:
    base: int
    factor: float
    cap: int
    explicit_cap: bool


@dataclass(frozen=True, slots=True)
class _Fibonacci:
    base: int
    cap: int
    explicit_cap: bool


@dataclass(frozen=True, slots=True)
class _Decorrelated:
    base: int
    cap: int


@dataclass(frozen=True, slots=True)
class _Delays:
    delays: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Capped:
    inner: _Node
    cap: int


@dataclass(frozen=True, slots=True)
class _Jittered:
    inner: _Node
    fraction: float


@dataclass(frozen=True, slots=True)
class _UpTo:
    inner: _Node
    limit: int


@dataclass(frozen=True, slots=True)
class _Union:
    a: _Node
    b: _Node


@dataclass(frozen=True, slots=True)
class _Intersection:
    a: _Node
    b: _Node


@dataclass(frozen=True, slots=True)
class _AndThen:
    a: _Node
    b: _Node


@dataclass(frozen=True, slots=True)
class _Attempts:
    inner: _Node
    count: int


_Node: TypeAlias = (
    "_Fixed | _Linear | _Exponential | _Fibonacci | _Decorrelated | _Delays | _Capped | _Jittered | _UpTo"
    " | _Union | _Intersection | _AndThen | _Attempts"
)



# --- saturating arithmetic -------------------------------------------------------------------

def _exp_delay(base: int, factor: float, cap: int, k: int) -> int:
    """``min(cap, base * factor**k)`` without ever overflowing, for any ``k >= 0``."""
    if base == 0 or cap == 0:
        return 0
    if base >= cap:
        return cap
    if factor == 1 or k == 0:
        return base
    # Compare in log space first so that factor**k is only computed when it stays below the cap.
    if k * math.log(factor) >= math.log(cap / base):
        return cap
    if isinstance(factor, int):
        return min(cap, base * int(factor**k))
    return min(cap, round(base * factor**k))


def _fib_delay(base: int, cap: int, n: int) -> int:
    """``min(cap, base * fib(n))`` with fib(1) = fib(2) = 1; saturates within ~92 steps."""
    if base == 0 or cap == 0:
        return 0
    a, b = 1, 1
    for _ in range(n - 1):
        if base * a >= cap:
            return cap
        a, b = b, a + b
    return min(cap, base * a)


# --- stepping --------------------------------------------------------------------------------

_Waited: TypeAlias = Callable[[int], int]


class _Step(ABC):
    """A stateful interpreter of one node: ``next(elapsed_ns)`` is the delay before the next
    attempt, or ``None`` to stop (and ``None`` for ever after). ``elapsed_ns`` is the time since
    this node started stepping. ``rng`` is ``None`` in maximal mode (jitter never shortens).

    ``waited`` (``None``: the delay itself) maps a delay this node returns to the one actually
    waited, as the jitters written above it will shorten it (each with this step's one draw): an
    ``up_to`` judges that, never a delay no one waits."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    @abstractmethod
    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None: ...

    def allows(self, elapsed_ns: int) -> bool:
        """Whether the elapsed-time limits (``up_to``) that allowed the last step also allow the
        next attempt to start ``elapsed_ns`` after the first began: asked when a longer wait
        replaces the delay the step judged (a Retry-After, in retry only for a schedule with an
        ``up_to``; the other side's longer delay, in an intersection)."""
        return True


class _FixedStep(_Step):
    __slots__ = ("d",)

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        return self.d


class _LinearStep(_Step):
    __slots__ = ("d",)

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        self.n += 1
        return min(MAX_NS, self.d * self.n)


class _ExpStep(_Step):
    __slots__ = ("node", "last")

    def __init__(self, node: _Exponential) -> None:
        super().__init__()
        self.node = node
        self.last = -1

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        node = self.node
        if self.last == node.cap:  # saturated: no more arithmetic, however many attempts follow
            return self.last
        self.last = _exp_delay(node.base, node.factor, node.cap, self.n)
        self.n += 1
        return self.last


class _FibStep(_Step):
    __slots__ = ("base", "cap", "a", "b")

    def __init__(self, node: _Fibonacci) -> None:
        super().__init__()
        self.base, self.cap = node.base, node.cap
        self.a, self.b = 1, 1

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        value = min(self.cap, self.base * self.a)
        if value < self.cap and self.base:  # a zero base never reaches the cap: stop growing fib(n)
            self.a, self.b = self.b, self.a + self.b
        return value


class _DecorrelatedStep(_Step):
    __slots__ = ("base", "cap", "prev", "rng")

    def __init__(self, node: _Decorrelated, rng: random.Random | None) -> None:
        super().__init__()
        self.base, self.cap, self.prev, self.rng = node.base, node.cap, node.base, rng

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        high = min(self.cap, self.prev * 3)
        if self.rng is None or high <= self.base:
            value = high
        else:
            value = min(high, self.base + int((high - self.base) * self.rng.random()))
        self.prev = value
        return value


class _DelaysStep(_Step):
    __slots__ = ("delays",)

    def __init__(self, delays: tuple[int, ...]) -> None:
        super().__init__()
        self.delays = delays

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        if self.n >= len(self.delays):
            return None
        self.n += 1
        return self.delays[self.n - 1]


class _CappedStep(_Step):
    __slots__ = ("inner", "cap")

    def __init__(self, inner: _Step, cap: int) -> None:
        super().__init__()
        self.inner, self.cap = inner, cap

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        cap = self.cap
        d = self.inner.next(elapsed_ns, None if waited is None else lambda x: waited(x if x <= cap else cap))
        return d if d is None or d <= cap else cap

    def allows(self, elapsed_ns: int) -> bool:
        return self.inner.allows(elapsed_ns)


class _JitterStep(_Step):
    __slots__ = ("inner", "fraction", "rng", "draw")

    def __init__(self, inner: _Step, fraction: float, rng: random.Random | None) -> None:
        super().__init__()
        self.inner, self.fraction, self.rng, self.draw = inner, fraction, rng, -1.0

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        if self.rng is None:
            return self.inner.next(elapsed_ns, waited)
        # One draw per step, made when first needed: by an up_to below judging the wait this
        # jitter makes of its delay (the delay actually waited, Schedule.up_to), or here.
        self.draw = -1.0
        shorten = self._shorten
        d = self.inner.next(elapsed_ns, shorten if waited is None else lambda x: waited(shorten(x)))
        return None if d is None else shorten(d)

    def _shorten(self, d: int) -> int:
        # Jitter only ever shortens, so whatever cap the inner delay respected still holds; and it
        # is monotone in d for one draw (to float precision, a few ns past 2**53 ns), so it
        # commutes with a union's min and an intersection's max.
        if d == 0 or self.rng is None:
            return d
        if self.draw < 0:
            self.draw = self.rng.random()
        cut = int(d * self.fraction * self.draw)
        return d - (cut if cut <= d else d)

    def allows(self, elapsed_ns: int) -> bool:
        return self.inner.allows(elapsed_ns)


class _UpToStep(_Step):
    __slots__ = ("inner", "limit", "done")

    def __init__(self, inner: _Step, limit: int) -> None:
        super().__init__()
        self.inner, self.limit, self.done = inner, limit, False

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        if self.done:
            return None
        d = self.inner.next(elapsed_ns, waited)
        # No attempt may start after the limit: stop when the wait would carry us past it (the
        # wait actually made, after any jitter written above this up_to).
        if d is None or elapsed_ns + (d if waited is None else waited(d)) > self.limit:
            self.done = True
            return None
        return d

    def allows(self, elapsed_ns: int) -> bool:
        return elapsed_ns <= self.limit and self.inner.allows(elapsed_ns)


class _UnionStep(_Step):
    __slots__ = ("a", "b", "a_done", "b_done")

    def __init__(self, a: _Step, b: _Step) -> None:
        super().__init__()
        self.a, self.b, self.a_done, self.b_done = a, b, False, False

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        da = None if self.a_done else self.a.next(elapsed_ns, waited)
        db = None if self.b_done else self.b.next(elapsed_ns, waited)
        self.a_done, self.b_done = da is None, db is None
        if da is None:
            return db
        if db is None:
            return da
        return da if da <= db else db

    def allows(self, elapsed_ns: int) -> bool:
        # Either side still going on may carry the union on.
        return (not self.a_done and self.a.allows(elapsed_ns)) or (not self.b_done and self.b.allows(elapsed_ns))


class _IntersectionStep(_Step):
    __slots__ = ("a", "b", "done")

    def __init__(self, a: _Step, b: _Step) -> None:
        super().__init__()
        self.a, self.b, self.done = a, b, False

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        if self.done:
            return None
        da = self.a.next(elapsed_ns, waited)
        db = self.b.next(elapsed_ns, waited)
        if da is None or db is None:
            self.done = True
            return None
        # The side with the shorter delay judged its limits (up_to) on that one: waiting the
        # longer instead must still start the next attempt within them, or that side stops.
        d, shorter = (da, self.b) if da >= db else (db, self.a)
        if not shorter.allows(elapsed_ns + (d if waited is None else waited(d))):
            self.done = True
            return None
        return d

    def allows(self, elapsed_ns: int) -> bool:
        return self.a.allows(elapsed_ns) and self.b.allows(elapsed_ns)


class _AndThenStep(_Step):
    __slots__ = ("a", "b", "offset")

    def __init__(self, a: _Step, b: _Step) -> None:
        super().__init__()
        self.a, self.b, self.offset = a, b, -1

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        if self.offset < 0:
            d = self.a.next(elapsed_ns, waited)
            if d is not None:
                return d
            self.offset = elapsed_ns  # the second schedule starts its own clock now
        return self.b.next(elapsed_ns - self.offset, waited)

    def allows(self, elapsed_ns: int) -> bool:
        # Past the first schedule's limits, the second takes over from its own start.
        return self.offset < 0 or self.b.allows(elapsed_ns - self.offset)


class _AttemptsStep(_Step):
    __slots__ = ("inner", "retries")

    def __init__(self, inner: _Step, count: int) -> None:
        super().__init__()
        self.inner, self.retries = inner, count - 1

    def next(self, elapsed_ns: int, waited: _Waited | None = None) -> int | None:
        if self.n >= self.retries:
            return None
        d = self.inner.next(elapsed_ns, waited)
        if d is None:
            self.n = self.retries
            return None
        self.n += 1
        return d

    def allows(self, elapsed_ns: int) -> bool:
        return self.inner.allows(elapsed_ns)


def _build(node: _Node, rng: random.Random | None) -> _Step:
    match node:
        case _Fixed(delay):
            return _FixedStep(delay)
        case _Linear(step):
            return _LinearStep(step)
        case _Exponential():
            return _ExpStep(node)
        case _Fibonacci():
            return _FibStep(node)
        case _Decorrelated():
            return _DecorrelatedStep(node, rng)
        case _Delays(delays):
            return _DelaysStep(delays)
        case _Capped(inner, cap):
            return _CappedStep(_build(inner, rng), cap)
        case _Jittered(inner, fraction):
            return _JitterStep(_build(inner, rng), fraction, rng)
        case _UpTo(inner, limit):
            return _UpToStep(_build(inner, rng), limit)
        case _Union(a, b):
            return _UnionStep(_build(a, rng), _build(b, rng))
        case _Intersection(a, b):
            return _IntersectionStep(_build(a, rng), _build(b, rng))
        case _AndThen(a, b):
            return _AndThenStep(_build(a, rng), _build(b, rng))
        case _Attempts(inner, count):
            return _AttemptsStep(_build(inner, rng), count)
    raise AssertionError(f"unknown schedule node {node!r}")  # pragma: no cover


# --- structural facts ------------------------------------------------------------------------

def _max_retries(node: _Node) -> int | None:
    """The most retries ``node`` can ever allow (``None``: unbounded)."""
    match node:
        case _Delays(delays):
            return len(delays)
        case _Capped(inner) | _Jittered(inner) | _UpTo(inner):
            return _max_retries(inner)
        case _Union(a, b):
            ra, rb = _max_retries(a), _max_retries(b)
            return None if ra is None or rb is None else max(ra, rb)
        case _Intersection(a, b):
            ra, rb = _max_retries(a), _max_retries(b)
            return rb if ra is None else ra if rb is None else min(ra, rb)
        case _AndThen(a, b):
            ra, rb = _max_retries(a), _max_retries(b)
            return None if ra is None or rb is None else ra + rb
        case _Attempts(inner, count):
            ri = _max_retries(inner)
            return count - 1 if ri is None else min(count - 1, ri)
    return None


def _has_up_to(node: _Node) -> bool:
    match node:
        case _UpTo():
            return True
        case _Capped(inner) | _Jittered(inner) | _Attempts(inner):
            return _has_up_to(inner)
        case _Union(a, b) | _Intersection(a, b) | _AndThen(a, b):
            return _has_up_to(a) or _has_up_to(b)
    return False


def _top_limit(node: _Node) -> int | None:
    """The tightest ``up_to`` limit that governs the whole schedule (through caps, jitter and
    attempt bounds), or ``None``. No attempt starts after it, so the total delay is within it."""
    match node:
        case _UpTo(inner, limit):
            below = _top_limit(inner)
            return limit if below is None else min(limit, below)
        case _Capped(inner) | _Jittered(inner) | _Attempts(inner):
            # These only ever shorten (or end) what the up_to below them allowed.
            return _top_limit(inner)
        case _Intersection(a, b):
            # Its longer wait is judged by both sides' limits (_IntersectionStep): each governs.
            la, lb = _top_limit(a), _top_limit(b)
            return lb if la is None else la if lb is None else min(la, lb)
    # Not through union or and_then: one side's limit does not stop the other.
    return None


def _prefix_bound(node: _Node, i: int) -> int:
    """An upper bound on any delay ``node`` can produce at step ``i`` or earlier, whatever the
    timing (used when ``up_to`` makes the exact worst case depend on how long attempts take)."""
    match node:
        case _Fixed(delay):
            return delay
        case _Linear(step):
            return min(MAX_NS, step * i)
        case _Exponential(base, factor, cap):
            return _exp_delay(base, factor, cap, i - 1)
        case _Fibonacci(base, cap):
            return _fib_delay(base, cap, i)
        case _Decorrelated(base, cap):
            return _exp_delay(base, 3, cap, i) if base < cap else cap
        case _Delays(delays):
            return max(delays[:i], default=0)
        case _Capped(inner, cap):
            return min(cap, _prefix_bound(inner, i))
        case _Jittered(inner) | _UpTo(inner) | _Attempts(inner):
            return _prefix_bound(inner, i)
        case _Union(a, b) | _Intersection(a, b) | _AndThen(a, b):
            return max(_prefix_bound(a, i), _prefix_bound(b, i))
    raise AssertionError(f"unknown schedule node {node!r}")  # pragma: no cover


# --- totals in time bounded by the structure, not the attempt count -----------------------------
#
# A schedule's maximal delays (and the per-step bounds used under ``up_to``) are built from a few
# shapes: constant, arithmetic (linear), a short growing prefix that saturates at a cap
# (exponential, Fibonacci, decorrelated), explicit lists, and elementwise min/max/concatenation/
# truncation of those. So they are kept as runs of arithmetic progressions, (count, first, step),
# and summed in closed form: ``attempts(sys.maxsize)`` costs what ``attempts(3)`` does.

_FOREVER = 1 << 256  # the count of a run that never ends (no schedule steps that often)
_GROWTH_LIMIT = 100_000  # explicit terms of a growing prefix before it is bounded by its cap

_Run = tuple[int, int, int]  # (count, first, step): first, first + step, ... (count terms)


def _explicit(values: list[int], tail: int | None) -> list[_Run]:
    runs = [(1, v, 0) for v in values]
    if tail is not None:
        runs.append((_FOREVER, tail, 0))
    return runs


def _take(runs: list[_Run], n: int) -> list[_Run]:
    """The first ``n`` terms."""
    out: list[_Run] = []
    for count, first, step in runs:
        if n <= 0:
            break
        out.append((min(count, n), first, step))
        n -= count
    return out


def _length(runs: list[_Run]) -> int:
    return sum(count for count, _, _ in runs)


def _drop(runs: list[_Run], n: int) -> list[_Run]:
    """All but the first ``n`` terms."""
    out: list[_Run] = []
    for count, first, step in runs:
        if n >= count:
            n -= count
            continue
        out.append((count - n, first + n * step, step))
        n = 0
    return out


def _pair(a: _Run, b: _Run, count: int, low: bool) -> list[_Run]:
    """Elementwise min (``low``) or max of two progressions over ``count`` terms: they cross at
    most once, so at most two runs."""
    _, a0, da = a
    _, b0, db = b
    last = count - 1
    a_end, b_end = a0 + last * da, b0 + last * db
    if (a0 <= b0) == (a_end <= b_end) or a0 == b0 or a_end == b_end:
        # One side wins throughout (lines meeting at an end still keep one side for every term).
        a_wins = (a0 <= b0 and a_end <= b_end) == low
        if a0 == b0:
            a_wins = (da <= db) == low
        elif a_end == b_end:
            a_wins = (a0 <= b0) == low
        return [(count, a0, da) if a_wins else (count, b0, db)]
    # They cross: the side lower at the start is lower for the first k terms.
    first_low, first_high = ((a0, da), (b0, db)) if a0 < b0 else ((b0, db), (a0, da))
    k = (first_high[0] - first_low[0]) // (first_low[1] - first_high[1]) + 1  # terms where it stays <=
    head, tail = (first_low, first_high) if low else (first_high, first_low)
    return [(k, head[0], head[1]), (count - k, tail[0] + k * tail[1], tail[1])]


def _zip(a: list[_Run], b: list[_Run], low: bool) -> list[_Run]:
    """Elementwise min/max over the terms both have."""
    out: list[_Run] = []
    ia = ib = 0
    ra, rb = (a[0] if a else None), (b[0] if b else None)
    while ra is not None and rb is not None:
        count = min(ra[0], rb[0])
        out.extend(_pair(ra, rb, count, low))
        ra = (ra[0] - count, ra[1] + count * ra[2], ra[2])
        rb = (rb[0] - count, rb[1] + count * rb[2], rb[2])
        if ra[0] == 0:
            ia += 1
            ra = a[ia] if ia < len(a) else None
        if rb[0] == 0:
            ib += 1
            rb = b[ib] if ib < len(b) else None
    return out


def _clip(runs: list[_Run], cap: int) -> list[_Run]:
    return _zip(runs, [(_FOREVER, cap, 0)], low=True)


def _growing(first: int, cap: int, n: int, grow: Callable[[int], int]) -> list[_Run]:
    """Terms ``first, grow(first), ...`` up to ``cap`` (where they stay), ``n`` at most needed."""
    values: list[int] = []
    value = first
    while value < cap and len(values) < min(n, _GROWTH_LIMIT):
        values.append(value)
        value = grow(value)
    # Beyond the limit the cap bounds the rest: still an upper bound (factor near 1 only).
    return _explicit(values, cap if value >= cap or len(values) >= _GROWTH_LIMIT else None)


def _exp_runs(base: int, factor: float, cap: int, n: int) -> list[_Run]:
    if base == 0 or cap == 0:
        return [(_FOREVER, 0, 0)]
    if base >= cap:
        return [(_FOREVER, cap, 0)]
    if factor == 1:
        return [(_FOREVER, base, 0)]
    values: list[int] = []
    k = 0
    while len(values) < min(n, _GROWTH_LIMIT):
        value = _exp_delay(base, factor, cap, k)
        if value >= cap:
            break
        values.append(value)
        k += 1
    return _explicit(values, cap)


def _maximal_runs(node: _Node, n: int) -> list[_Run]:
    """The delays ``_build(node, None)`` steps through (elapsed time ignored: no ``up_to``),
    as far as its first ``n`` terms are concerned."""
    match node:
        case _Fixed(delay):
            return [(_FOREVER, delay, 0)]
        case _Linear(step):
            return _clip([(_FOREVER, step, step)], MAX_NS)
        case _Exponential(base, factor, cap):
            return _exp_runs(base, factor, cap, n)
        case _Fibonacci(base, cap):
            if base == 0 or cap == 0:
                return [(_FOREVER, 0, 0)]
            fib: list[int] = []
            a, b = 1, 1
            while base * a < cap and len(fib) < n:
                fib.append(base * a)
                a, b = b, a + b
            return _explicit(fib, cap)
        case _Decorrelated(base, cap):
            return _growing(min(cap, base * 3), cap, n, lambda v: min(cap, v * 3)) if base else [(_FOREVER, 0, 0)]
        case _Delays(delays):
            return _explicit(list(delays[:n]), None)
        case _Capped(inner, cap):
            return _clip(_maximal_runs(inner, n), cap)
        case _Jittered(inner) | _UpTo(inner):
            return _maximal_runs(inner, n)  # maximal mode: jitter never shortens
        case _Union(a, b):
            ra, rb = _take(_maximal_runs(a, n), n), _take(_maximal_runs(b, n), n)
            la, lb = _length(ra), _length(rb)
            both = _zip(ra, rb, low=True)
            return both + (_drop(ra, lb) if la > lb else _drop(rb, la))  # the survivor goes on alone
        case _Intersection(a, b):
            return _zip(_take(_maximal_runs(a, n), n), _take(_maximal_runs(b, n), n), low=False)
        case _AndThen(a, b):
            ra = _take(_maximal_runs(a, n), n)
            return ra + _take(_maximal_runs(b, n), n - _length(ra))
        case _Attempts(inner, count):
            return _take(_maximal_runs(inner, min(n, count - 1)), count - 1)
    raise AssertionError(f"unknown schedule node {node!r}")  # pragma: no cover


def _bound_runs(node: _Node, n: int) -> list[_Run]:
    """:func:`_prefix_bound` for steps 1, 2, ... (never ending), as runs."""
    match node:
        case _Fixed() | _Linear() | _Exponential() | _Fibonacci() | _Decorrelated():
            return _maximal_runs(node, n)  # these never stop, and never shrink
        case _Delays(delays):
            best, running = 0, []
            for d in delays[:n]:
                best = max(best, d)
                running.append(best)
            return _explicit(running, best)
        case _Capped(inner, cap):
            return _clip(_bound_runs(inner, n), cap)
        case _Jittered(inner) | _UpTo(inner) | _Attempts(inner):
            return _bound_runs(inner, n)
        case _Union(a, b) | _Intersection(a, b) | _AndThen(a, b):
            return _zip(_bound_runs(a, n), _bound_runs(b, n), low=False)
    raise AssertionError(f"unknown schedule node {node!r}")  # pragma: no cover


def _sum(runs: list[_Run], n: int) -> int:
    """The sum of the first ``n`` terms, in closed form per run."""
    total = 0
    for count, first, step in _take(runs, n):
        total += count * first + step * count * (count - 1) // 2
    return total


def _total_delay(node: _Node, retries: int) -> int:
    """What ``maximum_total_delay`` reports, in ns: the sum of the maximal delays, or under
    ``up_to`` the sum of the per-step bounds within the governing limit (saturating)."""
    if not _has_up_to(node):
        return min(MAX_NS, _sum(_maximal_runs(node, retries), retries))
    total = _sum(_bound_runs(node, retries), retries)
    limit = _top_limit(node)
    if limit is not None:
        total = min(limit, total)
    return min(MAX_NS, total)


# --- repr ------------------------------------------------------------------------------------

def _sec(ns: int) -> str:
    """Source text for a duration that :func:`_ns` reads back as exactly ``ns``: whole seconds
    as an int, else the float of its seconds when that reads back (every duration given as a
    float does), else the ``timedelta`` it was given as, in datetime's own repr: past a few
    million seconds the float nearest a timedelta's seconds may read back some ns away (past
    2**53 ns, about 104 days, no float holds every microsecond)."""
    if ns % 1_000_000_000 == 0:
        return str(ns // 1_000_000_000)
    seconds = ns / 1e9
    if ns % 1000 or _ns(seconds, "delay", allow_zero=True) == ns:
        return repr(seconds)  # (off the microsecond grid: a float's, which reads back)
    return repr(timedelta(microseconds=ns // 1000))


def _fraction(fraction: float) -> str:
    if fraction == 1.0:
        return ""
    if fraction == 0.5:
        return '"equal"'
    return repr(fraction)


def _repr(node: _Node) -> str:
    match node:
        case _Fixed(delay):
            return f"Schedule.fixed({_sec(delay)})"
        case _Linear(step):
            return f"Schedule.linear({_sec(step)})"
        case _Exponential(base, factor, cap, explicit):
            text = f"Schedule.exponential({_sec(base)}" + ("" if factor == 2 else f", factor={factor!r}") + ")"
            return text + (f".capped({_sec(cap)})" if explicit else "")
        case _Fibonacci(base, cap, explicit):
            return f"Schedule.fibonacci({_sec(base)})" + (f".capped({_sec(cap)})" if explicit else "")
        case _Decorrelated(base, cap):
            return f"Schedule.decorrelated({_sec(base)}, {_sec(cap)})"
        case _Delays(delays):
            return f"Schedule.delays([{', '.join(_sec(d) for d in delays)}])"
        case _Capped(inner, cap):
            return f"{_repr(inner)}.capped({_sec(cap)})"
        case _Jittered(inner, fraction):
            return f"{_repr(inner)}.jittered({_fraction(fraction)})"
        case _UpTo(inner, limit):
            return f"{_repr(inner)}.up_to({_sec(limit)})"
        case _Union(a, b):
            return f"{_repr(a)}.union({_repr(b)})"
        case _Intersection(a, b):
            return f"{_repr(a)}.intersection({_repr(b)})"
        case _AndThen(a, b):
            return f"{_repr(a)}.and_then({_repr(b)})"
        case _Attempts(inner, count):
            return f"{_repr(inner)}.attempts({count})"
    raise AssertionError(f"unknown schedule node {node!r}")  # pragma: no cover


def _is_random(node: _Node) -> bool:
    """Whether jitter or decorrelated randomness lies under ``node`` (through any wrapper)."""
    match node:
        case _Jittered() | _Decorrelated():
            return True
        case _Capped(inner) | _UpTo(inner) | _Attempts(inner):
            return _is_random(inner)
        case _Union(a, b) | _Intersection(a, b) | _AndThen(a, b):
            return _is_random(a) or _is_random(b)
    return False


def _cap(node: _Node, cap: int, replace_default: bool) -> _Node:
    """``node`` with no delay above ``cap``; ``replace_default``: directly after a base, where
    the cap replaces an exponential's or Fibonacci's default one.

    Randomness must come after the cap (field report 7): a cap above a jitter would put every
    delay that reaches it at exactly the cap, in lockstep across callers. And an ``up_to`` must
    judge the delay actually waited: beneath a cap it would judge the uncapped one, and stop
    ``exponential(1).up_to(30).capped(5)`` at 17 s though the next attempt would start at 22 s.
    So the cap is pushed beneath any randomness and any ``up_to``, through attempt bounds,
    elapsed limits and combinators (capping commutes with them: min and max distribute over a
    cap, and a bound only counts).
    """
    match node:
        case _Jittered(inner, fraction):
            return _Jittered(_cap(inner, cap, replace_default), fraction)
        case _Exponential(base, factor, old, explicit) if replace_default or cap < old:
            return _Exponential(base, factor, cap if replace_default and not explicit else min(old, cap), True)
        case _Fibonacci(base, old, explicit) if replace_default or cap < old:
            return _Fibonacci(base, cap if replace_default and not explicit else min(old, cap), True)
        case _Exponential() | _Fibonacci():
            return node  # reached past a wrapper, the cap is at or above the base's own: no change
        case _Decorrelated(base, old) if cap >= base:
            return _Decorrelated(base, min(old, cap))
        case _Capped(inner, old):
            if _is_random(inner) or _has_up_to(inner):
                return _cap(inner, min(old, cap), False)
            return _Capped(inner, min(old, cap))
    if _is_random(node) or _has_up_to(node):
        match node:
            case _Attempts(inner, count):
                return _Attempts(_cap(inner, cap, False), count)
            case _UpTo(inner, limit):
                return _UpTo(_cap(inner, cap, False), limit)
            case _Union(a, b):
                return _Union(_cap(a, cap, False), _cap(b, cap, False))
            case _Intersection(a, b):
                return _Intersection(_cap(a, cap, False), _cap(b, cap, False))
            case _AndThen(a, b):
                return _AndThen(_cap(a, cap, False), _cap(b, cap, False))
    return _Capped(node, cap)


def _wrap(node: _Node) -> Schedule:
    """The value for ``node``: a :class:`BoundedSchedule` exactly when its retries are finite."""
    return BoundedSchedule(node) if _max_retries(node) is not None else Schedule(node)


# --- the public values -----------------------------------------------------------------------

class Schedule:
    """When to try again: an immutable, inspectable tree (seed 001, "Schedules are data").

    Build one from a base (:meth:`fixed`, :meth:`linear`, :meth:`exponential`, :meth:`fibonacci`,
    :meth:`decorrelated`) and refine it (:meth:`capped`, :meth:`jittered`, :meth:`up_to`,
    :meth:`union`, :meth:`intersection`, :meth:`and_then`); bound it with :meth:`attempts` to get
    the :class:`BoundedSchedule` that ``retry`` accepts. Durations are seconds (float, int or
    ``timedelta``); a negative or non-finite one raises ``ValueError`` naming the parameter.

    Schedules compare and hash by structure and print as the code that builds them. The n-th
    delay is the wait after the n-th failed attempt (before attempt n + 1).
    """

    __slots__ = ("_node",)
    _node: _Node

    def __init__(self, node: _Node) -> None:
        # Private: build schedules with the class methods.
        object.__setattr__(self, "_node", node)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    # --- bases ---
    @staticmethod
    def fixed(delay: Seconds) -> Schedule:
        """The same ``delay`` (seconds, >= 0) before every retry. Unbounded."""
        return Schedule(_Fixed(_ns(delay, "delay", allow_zero=True)))

    @staticmethod
    def linear(step: Seconds) -> Schedule:
        """``step``, ``2 x step``, ``3 x step``, ... (seconds, >= 0; saturating). Unbounded, uncapped."""
        return Schedule(_Linear(_ns(step, "step", allow_zero=True)))

    @staticmethod
    def exponential(base: Seconds, factor: float = 2) -> Schedule:
        """``base``, ``base x factor``, ``base x factor**2``, ... capped at five minutes unless
        :meth:`capped` follows directly (then that cap replaces the default).

        Raises ``ValueError`` for a negative or non-finite ``base`` or ``factor`` below 1."""
        base_ns = _ns(base, "base", allow_zero=True)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not _finite(factor) or factor < 1:
            raise ValueError(f"factor must be a finite number >= 1, got {_show(factor)}")
        # One number, one value: 3.0 is kept as 3 (exact powers), an integer beyond 2**53 (all
        # floats there are integers) as its float, so equal schedules print alike and step alike.
        if isinstance(factor, float) and factor.is_integer() and factor <= 2**53:
            factor = int(factor)
        elif isinstance(factor, int) and factor > 2**53 and float(factor) == factor:
            factor = float(factor)
        return Schedule(_Exponential(base_ns, factor, DEFAULT_CAP_NS, False))

    @staticmethod
    def fibonacci(base: Seconds) -> Schedule:
        """``base x 1, 1, 2, 3, 5, 8, ...``, capped at five minutes unless :meth:`capped` follows."""
        return Schedule(_Fibonacci(_ns(base, "base", allow_zero=True), DEFAULT_CAP_NS, False))

    @staticmethod
    def decorrelated(base: Seconds, cap: Seconds) -> Schedule:
        """Decorrelated jitter: each delay is drawn uniformly from ``[base, min(cap, 3 x
        previous)]`` (the previous starting at ``base``): the cap bounds the range drawn from, so
        delays that reach it still spread out. Random by construction.

        Raises ``ValueError`` for negative durations or ``cap < base``."""
        base_ns = _ns(base, "base", allow_zero=True)
        cap_ns = _ns(cap, "cap", allow_zero=True)
        if cap_ns < base_ns:
            raise ValueError(f"cap must be >= base ({base!r} seconds), got {cap!r}")
        return Schedule(_Decorrelated(base_ns, cap_ns))

    @staticmethod
    def delays(delays: Iterable[Seconds]) -> BoundedSchedule:
        """Exactly these delays, then stop: ``len(delays) + 1`` attempts at most. An empty list
        means a single attempt. Raises ``ValueError`` for a negative or non-finite delay,
        ``TypeError`` for a non-iterable, a string or bytes (``b"1"`` is not ``[49]`` seconds).
        Each delay saturates at ``MAX_NS``."""
        if isinstance(delays, (str, bytes, bytearray, memoryview)) or not isinstance(delays, Iterable):
            raise TypeError(f"delays must be an iterable of durations (seconds or timedelta), "
                            f"got {type(delays).__name__}")
        return BoundedSchedule(_Delays(tuple(_ns(d, f"delays[{i}]", allow_zero=True) for i, d in enumerate(delays))))

    # --- refinements ---
    def capped(self: _S, at: Seconds) -> _S:
        """No delay above ``at`` seconds (>= 0). Directly after an exponential or Fibonacci base
        (its jitter aside) it replaces the default five-minute cap; anywhere else it only lowers.
        Randomness (``jittered``, ``decorrelated``) is always applied after the cap, wherever
        the cap is written, so delays at the cap still spread out; and an ``up_to`` always judges
        the capped delay, the one actually waited."""
        return _wrap(_cap(self._node, _ns(at, "at", allow_zero=True), True))  # type: ignore[return-value]

    def jittered(self: _S, kind: Literal["full", "equal"] | float = "full") -> _S:
        """Shorten each delay by a random part: ``"full"`` draws from ``(0, d]``, ``"equal"``
        from ``(d/2, d]``, a number ``f`` in [0, 1] from ``(d x (1 - f), d]``. Jitter never
        lengthens a delay, so every cap holds, and it is applied after any cap, so delays at the
        cap still spread out. An ``up_to`` written before it judges the jittered delay, the one
        actually waited, as one written after it does. Randomness comes from the retry's call-site stream
        (reproducible under ``stoic.testing.seeded``). ``ValueError`` for another kind or a
        fraction outside [0, 1]."""
        if kind == "full":
            fraction = 1.0
        elif kind == "equal":
            fraction = 0.5
        elif isinstance(kind, str):
            raise ValueError(f'jitter kind must be "full", "equal" or a fraction in [0, 1], got {kind!r}')
        else:
            # (+ 0.0: a -0.0 is the 0.0 it equals, and prints so)
            fraction = check_fraction(kind, "kind (the jitter fraction)", low_open=False) + 0.0
        return _wrap(_Jittered(self._node, fraction))  # type: ignore[return-value]

    def up_to(self: _S, elapsed: Seconds) -> _S:
        """Also stop once another attempt would start more than ``elapsed`` seconds after the
        first began, judged on the delay actually waited (capped and jittered, wherever the cap or
        the jitter is written). An extra stop condition, not a bound: it does not make a schedule bounded
        (a zero-delay schedule under a time limit could spin)."""
        return _wrap(_UpTo(self._node, _ns(elapsed, "elapsed", allow_zero=True)))  # type: ignore[return-value]

    def union(self, other: Schedule) -> Schedule:
        """Go on while either goes on, waiting the shorter of their delays. Bounded when both are.
        ``TypeError`` unless ``other`` is a :class:`Schedule`."""
        return _wrap(_Union(self._node, _node_of(other)))

    @overload
    def intersection(self, other: BoundedSchedule) -> BoundedSchedule: ...
    @overload
    def intersection(self, other: Schedule) -> Schedule: ...
    def intersection(self, other: Schedule) -> Schedule:
        """Go on while both go on, waiting the longer of their delays; a side with an ``up_to``
        judges that longer wait, so no attempt starts past either side's limit. Bounded when
        either is. ``TypeError`` unless ``other`` is a :class:`Schedule`."""
        return _wrap(_Intersection(self._node, _node_of(other)))

    def and_then(self, other: Schedule) -> Schedule:
        """This schedule until it stops, then ``other`` from its start (its own elapsed clock).
        Bounded when both are. ``TypeError`` unless ``other`` is a :class:`Schedule`."""
        return _wrap(_AndThen(self._node, _node_of(other)))

    def attempts(self, count: int) -> BoundedSchedule:
        """At most ``count`` attempts in all (the first included): the way to bound a schedule.
        ``ValueError`` unless ``count`` is an integer >= 1 (zero never means "unlimited")."""
        check_int(count, "count", minimum=1)
        node = self._node
        if isinstance(node, _Attempts):
            return BoundedSchedule(_Attempts(node.inner, min(node.count, count)))
        return BoundedSchedule(_Attempts(node, count))

    # --- inspection ---
    def maximal_delays(self, limit: int) -> list[float]:
        """The first ``limit`` delays (seconds) of the worst case: jitter at its longest,
        attempts failing instantly (which is how ``up_to`` limits are evaluated here). Fewer when
        the schedule stops earlier. ``ValueError`` unless ``limit`` is an integer >= 0."""
        check_int(limit, "limit", minimum=0)
        return [d / 1e9 for d in self._delays_ns(None, limit)]

    def _delays_ns(self, rng: random.Random | None, limit: int) -> list[int]:
        step = _build(self._node, rng)
        out: list[int] = []
        elapsed = 0
        while len(out) < limit:
            d = step.next(elapsed)
            if d is None:
                break
            out.append(d)
            elapsed = min(MAX_NS, elapsed + d)
        return out

    def _stepper(self, rng: random.Random | None) -> _Step:
        """A fresh interpreter (``rng=None``: maximal mode, no jitter)."""
        return _build(self._node, rng)

    def _with(self, node: _Node) -> Schedule:
        return _wrap(node)

    @property
    def is_bounded(self) -> bool:
        """Whether the number of attempts is finite (then this is a :class:`BoundedSchedule`)."""
        return _max_retries(self._node) is not None

    def __repr__(self) -> str:
        return _repr(self._node)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return self._node == other._node

    def __hash__(self) -> int:
        return hash(self._node)

    def __reduce__(self) -> tuple[object, ...]:
        return (_wrap, (self._node,))


def _node_of(schedule: Schedule) -> _Node:
    if not isinstance(schedule, Schedule):
        raise TypeError(f"other must be a Schedule (or BoundedSchedule), got {type(schedule).__name__}")
    return schedule._node


class BoundedSchedule(Schedule):
    """A schedule with a finite number of attempts: what ``retry`` and ``Retrying`` accept.

    Made by :meth:`Schedule.attempts` or :meth:`Schedule.delays` (and kept by refining or
    combining bounded schedules). It knows its worst case, so a caller can derive an outer
    timeout from it instead of writing a second number down.
    """

    __slots__ = ("_timed", "_total_ns")
    _total_ns: int | None
    _timed: bool

    def __init__(self, node: _Node) -> None:
        super().__init__(node)
        object.__setattr__(self, "_total_ns", None)
        # Whether stepping needs the elapsed time (an up_to somewhere): retry reads the clock for
        # a first attempt only when this or an ambient deadline needs it.
        object.__setattr__(self, "_timed", _has_up_to(node))

    @overload
    def union(self, other: BoundedSchedule) -> BoundedSchedule: ...
    @overload
    def union(self, other: Schedule) -> Schedule: ...
    def union(self, other: Schedule) -> Schedule:
        return super().union(other)

    def intersection(self, other: Schedule) -> BoundedSchedule:
        return super().intersection(other)  # type: ignore[return-value]

    @overload
    def and_then(self, other: BoundedSchedule) -> BoundedSchedule: ...
    @overload
    def and_then(self, other: Schedule) -> Schedule: ...
    def and_then(self, other: Schedule) -> Schedule:
        return super().and_then(other)

    @property
    def maximum_attempts(self) -> int:
        """The most attempts this schedule allows, the first included."""
        retries = _max_retries(self._node)
        assert retries is not None
        return retries + 1

    @property
    def maximum_total_delay(self) -> float:
        """Seconds: an upper bound on the time spent waiting between attempts in one call.

        Exact (the sum of :meth:`maximal_delays`) unless ``up_to`` makes the delays depend on
        how long attempts take; then a safe bound that also never exceeds the ``up_to`` limit.
        The schedule's own delays only: a server's ``Retry-After`` replaces a delay (seed 001)
        and may be longer (retry caps it at five minutes; with ``up_to``, no attempt starts past
        the limit either way).
        """
        return self._total_delay_ns() / 1e9

    def _total_delay_ns(self) -> int:
        total = self._total_ns
        if total is None:
            total = _total_delay(self._node, self.maximum_attempts - 1)
            object.__setattr__(self, "_total_ns", total)
        return total

    def worst_case(self, attempt_timeout: Seconds) -> float:
        """Seconds the whole call can take when every attempt runs for ``attempt_timeout``:
        ``maximum_attempts x attempt_timeout + maximum_total_delay``, and under an ``up_to``
        limit that governs the whole schedule at most that limit plus one ``attempt_timeout``
        (no attempt starts past the limit, counted from the first attempt's start: a
        ``fixed(1).up_to(2.5).attempts(10)`` at 1 s per attempt ends by 3.5 s, not 12.5 s).
        Use it to size an outer ``stoic.timeout`` from the same numbers as the retry (seed 001,
        "API"). A ``Retry-After`` longer than the schedule's delay is outside the first form
        (see :meth:`maximum_total_delay`), never past the ``up_to`` limit.
        ``attempt_timeout`` is seconds or a ``timedelta``, > 0 (``ValueError`` naming it
        otherwise); the result saturates at ``MAX_NS`` ns (about 292 years)."""
        per_attempt = _ns(attempt_timeout, "attempt_timeout")
        worst = self.maximum_attempts * per_attempt + self._total_delay_ns()
        limit = _top_limit(self._node)
        if limit is not None:
            worst = min(worst, limit + per_attempt)
        return min(MAX_NS, worst) / 1e9

    def maximal_delays(self, limit: int | None = None) -> list[float]:
        """The worst-case delays (seconds), all of them unless ``limit`` is given."""
        return super().maximal_delays(self.maximum_attempts - 1 if limit is None else limit)



