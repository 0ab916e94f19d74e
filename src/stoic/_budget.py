"""Retry budgets: retrying can never turn an outage into a bigger one (seed 001, "Budgets").

Each first attempt deposits ``ratio`` earned tokens (capped, so a long success streak cannot
bank a burst for the next outage; a retry collapsed inside another's attempt deposits nothing,
its attempt being the outer's, and so does a retry in a hedge's attempt on the hedge's budget,
its attempt being the hedge's request, and a hedge in a retry's attempt or another hedge's
call on its budget, its call being that request); a reserve refills at ``reserve_per_second`` up to
``reserve_capacity`` so a quiet caller can still retry; every retry or hedge spends one token,
earned tokens first. Under a full outage retries add at most ``ratio`` x first attempts plus the
reserve's trickle. Arithmetic is exact integers: one token is 10**15 units.
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, ClassVar

from ._clock import Clock, check_clock, current_clock
from ._durations import _finite, check_fraction, check_int

_UNIT = 10**15  # units per token
_MAX_TOKENS = 10**15  # capacities beyond this are a mistake (and would not fit a float token count)
_UNITS_PER_NS_PER_TOKEN_PER_S = 10**6  # 1 token/s for 1 ns = 10**15 / 10**9 units


class RetryBudget:
    """A token bucket shared by the retries (and hedges) that use it.

    ``RetryBudget(ratio=0.2, reserve_per_second=1.0, reserve_capacity=10)`` is a bucket of its
    own; :meth:`named` shares one bucket per name; :data:`PER_CALL_SITE` (the default of
    ``retry``, ``Retrying`` and ``hedge``) gives each call site its own; :data:`UNLIMITED` never
    refuses. ``earned_capacity`` caps banked earned tokens (default ``max(10, reserve_capacity)``).

    Raises ``ValueError`` naming the parameter for ``ratio`` outside (0, 1], a negative or
    non-finite ``reserve_per_second`` (tokens per second), or a
    ``reserve_capacity``/``earned_capacity`` that is not a whole number in [0, 10**15]; ``TypeError`` for
    a ``reserve_per_second`` that is not a number (``True`` included) or a ``clock`` that is
    not a :class:`stoic.Clock`.
    The reserve starts full and refills on the budget's clock (``clock=``, else the ambient one).
    """

    PER_CALL_SITE: ClassVar[RetryBudget]
    UNLIMITED: ClassVar[RetryBudget]

    __slots__ = (
        "_clock", "_deposits", "_earned", "_earned_cap", "_folded", "_kind", "_last_ns", "_lock", "_ratio_units",
        "_name", "_ratio", "_refill_units_per_ns", "_reserve", "_reserve_cap", "_reserve_capacity",
        "_reserve_per_second",
    )

    def __init__(
        self,
        ratio: float = 0.2,
        reserve_per_second: float = 1.0,
        reserve_capacity: int = 10,
        *,
        earned_capacity: int | None = None,
        clock: Clock | None = None,
        _kind: str = "bucket",
        name: str | None = None,
    ) -> None:
        self._ratio = check_fraction(ratio, "ratio", low_open=True)
        if isinstance(reserve_per_second, bool) or not isinstance(reserve_per_second, (int, float)):
            raise TypeError(f"reserve_per_second must be tokens per second as a number, "
                            f"got {type(reserve_per_second).__name__}")
        if not _finite(reserve_per_second) or not 0 <= reserve_per_second <= _MAX_TOKENS:
            raise ValueError(f"reserve_per_second must be a number in [0, {_MAX_TOKENS:.0e}] (tokens per second), "
                             f"got {reserve_per_second!r}")
        # Whole tokens only: a fractional capacity would turn the exact integer arithmetic into floats.
        check_int(reserve_capacity, "reserve_capacity", minimum=0, maximum=_MAX_TOKENS)
        cap = max(10, reserve_capacity) if earned_capacity is None else check_int(
            earned_capacity, "earned_capacity", minimum=0, maximum=_MAX_TOKENS)
        self._reserve_per_second = float(reserve_per_second)
        self._reserve_capacity = reserve_capacity
        self._name = name
        self._kind = _kind
        self._ratio_units = round(self._ratio * _UNIT)
        self._refill_units_per_ns = round(self._reserve_per_second * _UNITS_PER_NS_PER_TOKEN_PER_S)
        self._earned_cap = cap * _UNIT
        self._reserve_cap = reserve_capacity * _UNIT
        self._earned = 0
        # Deposits are counted lock-free (next() on a count is atomic under the GIL) and folded
        # into _earned under the lock when tokens are read or spent. Folding n deposits at once
        # gives exactly the capped sum of n single deposits, since between spends only deposits
        # add: so a first attempt costs one next() call, not a lock round trip.
        self._deposits = itertools.count()
        self._folded = 0
        self._reserve = self._reserve_cap
        if clock is not None:
            check_clock(clock)
        self._clock = clock if clock is not None else current_clock()
        self._last_ns = self._clock.now_ns()
        self._lock = threading.Lock()

    @classmethod
    def named(cls, name: str, ratio: float = 0.2, reserve_per_second: float = 1.0,
              reserve_capacity: int = 10) -> RetryBudget:
        """The process-wide budget called ``name`` (created with these parameters on first use),
        shared by every call site that hits one dependency.

        Raises ``ValueError`` when a budget of that name already exists with other parameters:
        two call sites disagreeing about one dependency's budget is a configuration error.
        """
        budget = _registry.get(f"name:{name}", lambda: cls(ratio, reserve_per_second, reserve_capacity, name=name))
        wanted = (float(ratio), float(reserve_per_second), reserve_capacity)
        if (budget.ratio, budget.reserve_per_second, budget.reserve_capacity) != wanted:
            raise ValueError(
                f"RetryBudget.named({name!r}) already exists with ratio={budget.ratio}, "
                f"reserve_per_second={budget.reserve_per_second}, reserve_capacity={budget.reserve_capacity}; "
                f"got ratio={ratio}, reserve_per_second={reserve_per_second}, reserve_capacity={reserve_capacity}"
            )
        return budget

    @classmethod
    def for_call_site(cls, site: str, clock: Clock | None = None, *, kind: str = "") -> RetryBudget:
        """The default per-call-site budget for ``site`` (used when ``PER_CALL_SITE`` is given).

        ``kind`` tells apart call sites of different policies on one line: a hedge's bucket
        (``kind="hedge"``) is not the bucket of a retry written on the same line (a one-line
        ``hedge(IDEMPOTENT, lambda: retry(...), ...)``), which would otherwise earn twice per
        request, the hedge's call and the retry's first attempt, and let the retry spend 40%.
        Both report ``site`` as their :attr:`name`.

        With ``clock`` (the clock of the policy resolving it), the bucket refills on that clock
        from now on: a site's bucket follows the clock of the policy most recently built there,
        so a test on a :class:`stoic.testing.VirtualClock` never gets a bucket that a reset made
        on the system clock for a policy left over from an earlier test (which would refill in
        real time while the test runs)."""
        budget = _registry.get(f"site:{kind}:{site}" if kind else f"site:{site}", lambda: cls(name=site, clock=clock))
        if clock is not None and budget._clock is not clock:
            with budget._lock:
                budget._clock = clock
                budget._last_ns = clock.now_ns()
        return budget

    def resolve(self, site: str) -> RetryBudget:
        """The bucket this budget means at ``site``: itself, or the site's own for ``PER_CALL_SITE``."""
        return RetryBudget.for_call_site(site) if self._kind == "per_call_site" else self

    def _refill(self) -> None:
        now = self._clock.now_ns()
        elapsed = now - self._last_ns
        if elapsed > 0:
            self._last_ns = now
            self._reserve = min(self._reserve_cap, self._reserve + elapsed * self._refill_units_per_ns)

    def _fold(self) -> None:
        # Called with the lock held. This next() takes a number itself: skip it next time.
        taken = next(self._deposits)
        new = taken - self._folded
        self._folded = taken + 1
        if new:
            self._earned = min(self._earned_cap, self._earned + new * self._ratio_units)

    def deposit(self) -> None:
        """Record a first attempt: earn ``ratio`` tokens (up to the earned cap). Lock-free."""
        next(self._deposits)

    def _take_back(self) -> None:
        """Undo one :meth:`deposit`: the first attempt it was made for never reached the
        dependency (a misused operation, stoic._errors.misused). Exact while that deposit is
        not folded yet, which is the case unless another thread folded in between (the misuse
        is raised at the call, without awaiting); then its share comes off the earned tokens."""
        with self._lock:
            taken = next(self._deposits)  # (a number of its own: skipped, as _fold's is)
            pending = taken - self._folded
            self._folded = taken + 1
            if pending:  # fold every pending deposit but one
                self._earned = min(self._earned_cap, self._earned + (pending - 1) * self._ratio_units)
            else:
                self._earned = max(0, self._earned - self._ratio_units)

    def _give_back(self) -> None:
        """Return a token :meth:`try_spend` took for an attempt that never ran or never reached
        the dependency (a retry cancelled in its backoff, a misused hedge): as an earned one
        while under the earned cap, else to the reserve (up to its capacity)."""
        if self._kind == "unlimited":
            return
        with self._lock:
            self._fold()
            if self._earned + _UNIT <= self._earned_cap:
                self._earned += _UNIT
            else:
                self._refill()
                self._reserve = min(self._reserve_cap, self._reserve + _UNIT)

    def try_spend(self) -> bool:
        """Take one token for a retry or hedge; ``False`` (taking nothing) when there is none."""
        if self._kind == "unlimited":
            return True
        with self._lock:
            self._fold()
            if self._earned >= _UNIT:
                self._earned -= _UNIT
                return True
            self._refill()
            if self._reserve >= _UNIT:
                self._reserve -= _UNIT
                return True
            return False

    # The settings are read-only: earning and refilling run on values derived from them at
    # construction, so a written setting would show in repr and named() and change nothing.
    @property
    def ratio(self) -> float:
        """Tokens earned per first attempt, in (0, 1]."""
        return self._ratio

    @property
    def reserve_per_second(self) -> float:
        """Tokens the reserve refills per second (on the budget's clock)."""
        return self._reserve_per_second

    @property
    def reserve_capacity(self) -> int:
        """The reserve's size in whole tokens (it starts full)."""
        return self._reserve_capacity

    @property
    def name(self) -> str | None:
        """The name of a :meth:`named` budget, or the call site of a per-call-site bucket (else ``None``)."""
        return self._name

    @property
    def tokens(self) -> float:
        """Whole and fractional tokens available now (``inf`` when unlimited)."""
        if self._kind == "unlimited":
            return math.inf
        with self._lock:
            self._fold()
            self._refill()
            return (self._earned + self._reserve) / _UNIT

    def __repr__(self) -> str:
        if self._kind != "bucket":
            return f"RetryBudget.{self._kind.upper()}"
        return (f"RetryBudget(ratio={self.ratio}, reserve_per_second={self.reserve_per_second}, "
                f"reserve_capacity={self.reserve_capacity}{f', name={self.name!r}' if self.name else ''})")


class _Registry:
    def __init__(self) -> None:
        self._budgets: dict[str, RetryBudget] = {}
        # Instruction offset of a call site -> the chain of _Sites at that offset (one per code
        # object calling there, linked by .next): lets a hot call find its per-call-site budget
        # with one small-int lookup and an identity test, instead of formatting "file:line" or
        # hashing a code object (which hashes its contents: slow). Offsets are shared only by
        # sites in different functions, so chains stay short.
        self.frames: dict[int, _Site] = {}
        self.generation = 0  # bumped by clear(), so holders of a cached budget know to look again
        # Objects that resolved a per-call-site budget once (Retrying, @retrying): clear() has
        # them resolve it again, so their hot path reads the budget with no check at all.
        self._holders: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def get(self, key: str, make: Callable[[], RetryBudget]) -> RetryBudget:
        budget = self._budgets.get(key)
        if budget is None:
            with self._lock:
                budget = self._budgets.get(key)
                if budget is None:
                    budget = make()
                    self._budgets[key] = budget
        return budget

    def hold(self, holder: Any) -> None:
        """Call ``holder.resolve_budget()`` after every clear() while ``holder`` lives."""
        with self._lock:
            self._holders.add(holder)

    def clear(self) -> None:
        with self._lock:
            self._budgets.clear()
            self.frames.clear()
            self.generation += 1
            holders = list(self._holders)
        for holder in holders:  # outside the lock: resolving takes it
            holder.resolve_budget()


_registry = _Registry()

RetryBudget.PER_CALL_SITE = RetryBudget(_kind="per_call_site")
RetryBudget.UNLIMITED = RetryBudget(_kind="unlimited")


_NO_OP: tuple[object, bool] = (object(), False)  # no operation's code is this object


class _Site:
    """One call site of ``retry``/``retry_sync``: its code object (``_registry.frames`` maps an
    instruction offset to the chain of sites at it, linked by ``next``), its ``"file:line"``,
    its own budget, and ``op``: ``(code, wants)`` for the last operation seen there, so a site
    that keeps retrying one function decides whether to pass it an ``Attempt`` with one
    identity test. ``op`` is replaced whole (one store), so a thread never sees half of it.
    ``made`` is what a one-shot function (``hedge()``) built from the arguments it was last
    given there, with those arguments; ``classify`` and ``timeout`` the same for ``retry``'s
    classifier and attempt timeout, as ``(argument, derived)`` (each replaced whole, likewise)."""

    __slots__ = ("bucket", "classify", "code", "made", "name", "next", "op", "timeout")

    def __init__(self, code: object, name: str, bucket: RetryBudget, next: _Site | None) -> None:
        self.code = code
        self.name = name
        self.bucket = bucket
        self.next = next
        self.op: tuple[object, bool] = _NO_OP
        self.made: tuple[Any, ...] | None = None
        self.classify: tuple[object, Any] = _NO_OP
        self.timeout: tuple[object, Any] = _NO_OP


def site_of_frame(frame: FrameType) -> _Site:
    """The :class:`_Site` of the call being made in ``frame`` (created on first use).

    Two threads meeting a new site at once may both create it (a push can even be lost): both
    entries hold the site's one budget (the registry's), so a lost or doubled entry costs only
    a lookup."""
    code = frame.f_code
    lasti = frame.f_lasti
    head = _registry.frames.get(lasti)
    site = head
    while site is not None and site.code is not code:
        site = site.next
    if site is None:
        name = f"{code.co_filename}:{frame.f_lineno}"
        site = _Site(code, name, RetryBudget.for_call_site(name), head)
        _registry.frames[lasti] = site
    return site


def reset_budgets() -> None:
    """Forget every named and per-call-site budget (tests call this between cases)."""
    _registry.clear()
