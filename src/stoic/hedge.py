"""Hedged requests: start another copy of a slow call and take the first to succeed.

Seed 000, "hedge" (with "Cancellation and deadlines, for every policy" and "Events"), and seed
003, "Hedge" (the adaptive delay). Attempt 1 starts at once. If no attempt has succeeded
``delay`` after the latest start, the next starts beside the running ones, up to
``max_attempts``. The first success wins; the others are cancelled with the message
``"superseded"`` and awaited before the call returns, so nothing the call started is still
running when it returns. When every started attempt fails, the first failure (in completion
order) is raised. Hedging answers slowness only: a failure with no other attempt running is
raised at once, never followed by a hedge on a timer (that would be a retry, and would double
the load on a dependency exactly when it is failing).

Each hedge withdraws a token from a :class:`~stoic.RetryBudget` (each call's first attempt
deposits); without a token there is no hedge and the running attempts go on. A hedge the
ambient deadline leaves too little time for is not started (see :class:`Hedge`).

Only idempotent work may be hedged, and the call site has to say so: the first argument is
:data:`IDEMPOTENT`, the single member of :class:`Idempotency`.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import os
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar, cast

from . import _admission, _deadline, _metrics
from ._attempt import Attempt, _First
from ._budget import _NO_OP, RetryBudget, _registry
from ._clock import Clock, SystemClock, TimerHandle, current_clock, resolve_clock
from ._deadline import _current as _deadline_scope
from ._deadline import remaining_ns
from ._durations import Seconds, check_int, check_label, to_ns, to_seconds
from ._errors import DeadlineExceeded, close_unrun, is_defect, leaves, misused
from ._quantile import WindowedQuantile, _check_quantile, default_warmup
from ._random import construction_site
from ._retry import _IDLE, _NO_MARK, _caller_task, _counted_on, _getframe, _learn_op, _reset_marks, _set_marks, _site
from ._retune import validated
from .events import Level, emit, error_type
from .events._sinks import kind_floor

# The sinks wanting hedge events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("hedge")

if TYPE_CHECKING:
    import asyncio

    from .fleet import SharedLatency, SharedQuantile
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

R = TypeVar("R")

SUPERSEDED = "superseded"
"""The message of the ``CancelledError`` a losing attempt receives (``exc.args[0]``)."""


class Idempotency(enum.Enum):
    """The promise a caller makes before hedging: running the operation twice is safe.

    It has one member, :data:`IDEMPOTENT`, so hedging a call that is not idempotent means
    writing a false statement in the source, where a reviewer can see it.
    """

    IDEMPOTENT = "idempotent"


IDEMPOTENT = Idempotency.IDEMPOTENT
"""Pass as the first argument of :func:`hedge` / :meth:`Hedge.execute`."""


# Call ids: a random per-process prefix and a counter, 32 hex digits like ``uuid4().hex`` at a
# tenth of its cost (this is on every call's path). The prefix is drawn again in a forked child
# so two processes never hand out the same id.
_ids = itertools.count()
_id_prefix = os.urandom(8).hex()


def _reseed_ids() -> None:
    global _ids, _id_prefix
    _ids = itertools.count()
    _id_prefix = os.urandom(8).hex()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_ids)


def _new_call_id() -> str:
    return f"{_id_prefix}{next(_ids):016x}"


class _FirstAttempt(_First):
    """The first attempt's :class:`~stoic.Attempt`: its call id is the call's, drawn (cheaply)
    only when something reads it, so an operation that takes the Attempt but never sends the id
    pays for no id. Its number and flag are the class's (as for retry's first attempts), so
    building one sets a single slot, without ``Attempt.__init__`` (it is on every call's path)."""

    __slots__ = ("_call",)

    _call: _Call

    @property
    def call_id(self) -> str:
        return self._call.shared_call_id()  # (drawn once per call, then kept by the call)


_new_object = object.__new__
_set_call = _FirstAttempt.__dict__["_call"].__set__


def _first_attempt(call: _Call) -> _FirstAttempt:
    attempt = _new_object(_FirstAttempt)
    _set_call(attempt, call)
    return attempt


def _check_idempotency(idempotency: object) -> None:
    if idempotency is not IDEMPOTENT:
        raise TypeError(
            "hedge runs an operation more than once; pass stoic.IDEMPOTENT as the first argument "
            f"to state that this is safe, got {idempotency!r}"
        )


class Hedge:
    """A reusable hedging policy; keeps its adaptive delay across calls.

    ``Hedge(delay, *, label, max_attempts=2, budget=RetryBudget.PER_CALL_SITE,
    quantile=None, delay_min=None, delay_max=None, window=1000, clock=None, latency_digest=None)``

    - ``delay``: seconds (float or timedelta, >= 0) to wait after the latest start before
      starting the next attempt. With ``quantile`` set it is the delay used until the estimate
      has warmed up. ``0`` starts every attempt at once (a race).
    - ``max_attempts``: attempts in all, the first included (>= 2).
    - ``budget``: the :class:`~stoic.RetryBudget` hedges spend from; ``PER_CALL_SITE`` (the
      default) means one budget for the line that constructed this ``Hedge``.
    - ``label``: required, keyword-only, a non-empty str carried by every event.
    - ``quantile``: in (0, 1); when set, the delay is the streaming P-squared estimate of that
      quantile of the first attempts' latencies (seed 003, "Hedge"; a first attempt a hedge beat
      counts as long as it had run, a failed one not at all), clamped to
      [``delay_min``, ``delay_max``] (a latency above ``delay_max`` is taken as ``delay_max``,
      so one very slow primary cannot lift the delay for the rest of the epoch). The estimate
      restarts every ``window`` observations and keeps the previous epoch's value until the new
      epoch has enough samples, so it follows current traffic. ``delay_min``/``delay_max``
      (seconds, >= 0) require ``quantile``.
    - ``latency_digest``: a :class:`stoic.fleet.SharedLatency` (requires ``quantile``): the
      quantile is the fleet's, merged from every replica's samples in the store, and this
      estimate only while the fleet's is unknown (docs/fleet.md, "Latency signal").
    - ``clock``: the clock for timers and latencies; default the ambient clock at construction.

    Raises ``ValueError`` for a negative, non-finite or too long delay (the range of every
    duration: at most ``MAX_SECONDS``), ``max_attempts`` < 2, ``quantile`` outside (0, 1),
    ``delay_min`` > ``delay_max``, ``delay_min``/``delay_max`` without ``quantile``, ``window``
    < 5, or an empty ``label``; ``TypeError`` for a budget that is not a RetryBudget, a label
    that is not a str, or a ``clock`` that is not a :class:`~stoic.Clock`.

    Deadline rule: when a hedge is due and the ambient deadline (:func:`stoic.timeout`) leaves
    less time than the current delay, the hedge is skipped (``hedge.deadline_skip``) and no
    further hedge is started for that call: an attempt that has less time than the delay, which
    is meant to sit near the slow end of normal latency, would most likely be cut off by the
    deadline, costing a budget token and backend load for nothing.

    The operation is told which attempt it runs as retry tells it: an operation that declares a
    parameter named ``attempt`` receives ``attempt=Attempt(...)`` (by keyword); any other is
    called with exactly the arguments given.

    Not a :class:`~stoic.Policy`: the call must state idempotency, so it wraps a pipeline (or
    a plain call) from the outside.
    """

    __slots__ = (
        "__weakref__", "_budget", "_clock", "_delay_ns", "_digest", "_estimate", "_fixed_ns", "_lock", "_max_ns",
        "_label", "_max_attempts", "_min_ns", "_own", "_quantile", "_rec", "_run", "_site", "_window", "op",
    )

    def __init__(
        self,
        delay: Seconds,
        *,
        label: str,
        max_attempts: int = 2,
        budget: RetryBudget = RetryBudget.PER_CALL_SITE,
        quantile: float | None = None,
        delay_min: Seconds | None = None,
        delay_max: Seconds | None = None,
        window: int = 1000,
        clock: Clock | None = None,
        latency_digest: SharedLatency | None = None,
    ) -> None:
        self._setup(delay, max_attempts, budget, label, quantile, delay_min, delay_max, window, clock,
                    construction_site(1), latency_digest)

    def _setup(
        self,
        delay: Seconds,
        max_attempts: int,
        budget: RetryBudget,
        label: str,
        quantile: float | None,
        delay_min: Seconds | None,
        delay_max: Seconds | None,
        window: int,
        clock: Clock | None,
        site: str,
        digest: SharedLatency | None = None,
    ) -> None:
        self._label = check_label(label)
        self._site, self._digest = site, digest  # (a retune re-resolves a per-call-site budget here)
        self._fixed_ns = to_ns(delay, "delay", allow_zero=True)
        self._max_attempts = check_int(max_attempts, "max_attempts", minimum=2)
        if not isinstance(budget, RetryBudget):
            raise TypeError(f"budget must be a stoic.RetryBudget, got {type(budget).__name__}")
        self._clock = resolve_clock(clock)
        # The site's own bucket refills on this hedge's clock, as Retrying's does on its own, and
        # is taken again after reset_budgets() (a test's spent tokens never reach the next test).
        self._own = bool(site) and budget is RetryBudget.PER_CALL_SITE
        self._budget = budget
        if self._own:
            _registry.hold(self)  # (before resolving: a reset in between then resolves it again)
            self.resolve_budget()
        # A budget given (named, or an instance) may be a retry's too: such a hedge marks its
        # attempts, so that a retry in them on this budget makes no deposit (_race_marked). Its
        # own per-call-site budget is no retry's: that hedge pays nothing for the mark.
        self._run = _race if budget is RetryBudget.PER_CALL_SITE or budget is RetryBudget.UNLIMITED else _race_marked
        self._min_ns = None if delay_min is None else to_ns(delay_min, "delay_min", allow_zero=True)
        self._max_ns = None if delay_max is None else to_ns(delay_max, "delay_max", allow_zero=True)
        if isinstance(window, bool) or not isinstance(window, int) or window < 5:
            raise ValueError(f"window must be an integer >= 5, got {window!r}")
        self._window = window
        self._estimate: WindowedQuantile | SharedQuantile | None = None
        if quantile is None:
            self._quantile: float | None = None
            if self._min_ns is not None or self._max_ns is not None:
                raise ValueError("delay_min and delay_max require quantile (they bound the adaptive delay)")
            if digest is not None:
                raise ValueError("latency_digest requires quantile (it shares the adaptive delay's samples)")
        else:
            self._quantile = _check_quantile(quantile)
            if self._min_ns is not None and self._max_ns is not None and self._min_ns > self._max_ns:
                raise ValueError(f"delay_min must be <= delay_max, got {delay_min!r} > {delay_max!r}")
            warmup = default_warmup(self._quantile, window)
            # A latency above delay_max is fed as delay_max: the clamped delay is the same for the
            # true quantile, and one very slow primary cannot pull P-squared's markers (and so the
            # delay) far past the rest of the epoch (stoic._quantile.WindowedQuantile's cap).
            # A delay_max of 0 clamps every delay to 0 (a race), whatever is fed: no cap then.
            cap = None if not self._max_ns else float(self._max_ns)
            if digest is None:
                self._estimate = WindowedQuantile(self._quantile, window, warmup, cap)
            else:
                from .fleet._latency import check_digest

                self._estimate = check_digest(digest, "latency_digest").estimator(self._quantile, window, warmup, cap)
        self._delay_ns = self._fixed_ns
        # Only an adaptive hedge has state shared across calls (and threads) to guard.
        self._lock = threading.Lock() if self._estimate is not None else None
        self._rec = _metrics.recorder("hedge", self._label, self)
        self.op: tuple[object, bool] = _NO_OP  # (code, wants) of the last operation (see _learn_op)

    def resolve_budget(self) -> None:
        """Take this hedge's site's own budget from the registry (at construction, and after
        every ``reset_budgets()`` while the hedge spends from it). Retried if a reset ran
        meanwhile, so the bucket kept is never one a reset dropped."""
        while self._own:
            generation = _registry.generation
            self._budget = RetryBudget.for_call_site(self._site, self._clock, kind="hedge")
            if generation == _registry.generation:
                return

    @property
    def label(self) -> str:
        """The label carried by every event, metric and error of this hedge (read-only)."""
        return self._label

    # The settings are read-only (change them with ControlPlane.retune, which validates them):
    # the estimate is built from quantile and window, so a written one would show and do nothing.
    @property
    def max_attempts(self) -> int:
        """Attempts in all, the first included (>= 2)."""
        return self._max_attempts

    @property
    def quantile(self) -> float | None:
        """The latency quantile the delay follows, in (0, 1), or ``None`` for a fixed delay."""
        return self._quantile

    @property
    def window(self) -> int:
        """First-attempt latencies per estimation epoch (an int >= 1)."""
        return self._window

    @property
    def current_delay(self) -> float:
        """The delay (seconds) the next call would wait before its first hedge."""
        return self._delay_ns / 1e9

    @property
    def budget(self) -> RetryBudget:
        """The (resolved) budget hedges spend from."""
        return self._budget

    def _retune(self, **changes: Any) -> None:
        """Swap ``delay``, ``max_attempts``, ``budget``, ``quantile``, ``delay_min``, ``delay_max``
        and ``window`` live (stoic.ControlPlane.retune), validated by the constructor
        (``ValueError`` naming the parameter; the hedge unchanged). The adaptive delay's estimate
        starts afresh (the delay is ``delay`` until it has warmed up again); calls in flight
        read the new delay and attempt count at their next decision."""
        # Marking follows the budget: kept, or back to the hedge's own per-call-site one (which
        # the fresh policy below receives resolved, as if given) means as before, or none.
        own = changes.get("budget", self._budget) is RetryBudget.PER_CALL_SITE or (
            "budget" not in changes and self._run is _race)
        site_bucket: RetryBudget | None = None
        if changes.get("budget") is RetryBudget.PER_CALL_SITE and self._site:
            # The site is this hedge's construction, not the retune's (as the constructor resolves it).
            site_bucket = RetryBudget.for_call_site(self._site, self._clock, kind="hedge")
            changes = {**changes, "budget": site_bucket}
        fresh = validated(self, {
            "delay": to_seconds(self._fixed_ns), "max_attempts": self._max_attempts, "budget": self._budget,
            "quantile": self._quantile, "delay_min": None if self._min_ns is None else to_seconds(self._min_ns),
            "delay_max": None if self._max_ns is None else to_seconds(self._max_ns), "window": self._window,
            "latency_digest": self._digest,
        }, changes)
        # A lock once made is kept: a call in flight may be about to observe under it.
        lock = self._lock = self._lock or fresh._lock
        with lock if lock is not None else contextlib.nullcontext():
            self._fixed_ns, self._max_attempts, self._budget = fresh._fixed_ns, fresh._max_attempts, fresh._budget
            # Whether a reset re-resolves it: the site's own bucket (kept, or given back), not another.
            self._own = bool(self._site) and (
                changes["budget"] is site_bucket if "budget" in changes else self._own)
            if self._own:
                _registry.hold(self)
            self._run = _race if own else fresh._run
            self._min_ns, self._max_ns, self._window = fresh._min_ns, fresh._max_ns, fresh._window
            self._quantile, self._estimate, self._delay_ns = fresh._quantile, fresh._estimate, fresh._delay_ns

    def _observe(self, latency_ns: int) -> None:
        # Seed 003: the primaries' latencies (of a first attempt that won, or at least how long
        # one ran before a hedge beat it); never of a failed one.
        estimate = self._estimate
        assert estimate is not None and self._lock is not None
        with self._lock:
            estimate.add(float(latency_ns))
            value = estimate.value
            if value is None:
                return
            ns = round(value)
            if self._min_ns is not None and ns < self._min_ns:
                ns = self._min_ns
            if self._max_ns is not None and ns > self._max_ns:
                ns = self._max_ns
            self._delay_ns = ns

    def execute(
        self, idempotency: Idempotency, fn: Callable[..., Coroutine[Any, Any, R]], /, *args: Any, **kwargs: Any
    ) -> Coroutine[Any, Any, R]:
        """Run ``fn(*args, **kwargs)`` hedged; ``await`` it for the first successful result.

        ``idempotency`` must be :data:`IDEMPOTENT` (``TypeError`` at the call otherwise). ``fn``
        is an async callable; when it declares a parameter named ``attempt`` each attempt
        receives ``attempt=`` an :class:`~stoic.Attempt` (``number`` from 1, a ``call_id``
        shared by the call's attempts, ``hedged`` true from attempt 2 on).

        The first attempt runs in the calling task, as a plain ``await`` would (so a call that
        finishes before the delay costs little more than one); hedges run as tasks in a copy of
        the caller's context (deadline, sinks and clock included).

        Returns the first successful attempt's result after every other attempt has been
        cancelled (message ``"superseded"``) and has finished. Raises the first failure in
        completion order when every started attempt failed, or at once when an attempt fails
        and no other is running. Raises :class:`~stoic.DeadlineExceeded` without running ``fn``
        when the ambient deadline has already passed, and :class:`~stoic.ClockMismatch` when
        that deadline runs on another clock than this hedge. When the caller is cancelled (or
        its deadline fires), every attempt is cancelled and awaited, then ``CancelledError``
        propagates (or the first attempt's own exception, if it turned the cancellation into
        one, as a plain ``await`` would raise it). "The caller is cancelled" means the task has
        more cancel requests than when the call started (a request swallowed earlier in the
        task, ``task.cancelling()`` left above 0, does not count). A ``KeyboardInterrupt``,
        ``SystemExit`` or other ``BaseException`` that is not an ``Exception`` (bare or in a
        group; ``CancelledError`` aside) from any attempt stops the call: the other attempts
        are cancelled and awaited, then it propagates unchanged, reported as no attempt's
        failure. So does a misused operation's ``TypeError`` (``fn`` called with arguments it
        does not take, not callable, or a plain function whose value cannot be awaited:
        stoic._errors.misused), with no ``hedge.attempt_failed``, the call's deposit or that
        hedge's token given back; and so does a :class:`stoic.Defect` from any attempt (never
        hedged past: another attempt's success does not stand in for the bug).

        A plain method returning the coroutine (one coroutine frame per call, not two).
        """
        _check_idempotency(idempotency)
        return self._run(self, fn, args, kwargs)

    def __repr__(self) -> str:
        adaptive = f", quantile={self._quantile}" if self._quantile is not None else ""
        return (f"Hedge(delay={self._fixed_ns / 1e9}, max_attempts={self._max_attempts}{adaptive}, "
                f"label={self._label!r}, current_delay={self.current_delay})")


def hedge(
    idempotency: Idempotency,
    fn: Callable[..., Coroutine[Any, Any, R]],
    *,
    delay: Seconds,
    label: str,
    max_attempts: int = 2,
    budget: RetryBudget = RetryBudget.PER_CALL_SITE,
    clock: Clock | None = None,
) -> Coroutine[Any, Any, R]:
    """Run ``fn()`` hedged once: ``result = await hedge(IDEMPOTENT, fn, delay=0.05, label="api")``.

    ``fn`` takes no argument, or ``attempt`` (by keyword: an :class:`~stoic.Attempt`) when it
    declares it. See :class:`Hedge` for the parameters and the rules; ``label`` is required, as
    on every policy. ``idempotency`` must be
    :data:`IDEMPOTENT`. ``delay`` is seconds (float or timedelta, >= 0); ``max_attempts`` >= 2
    counts the first attempt. ``budget`` defaults to one budget per line that calls ``hedge()``.
    ``clock`` defaults to the ambient clock at the call. The delay is fixed; keep a
    :class:`Hedge` across calls for an adaptive one.

    Arguments are checked when ``hedge()`` is called (``TypeError`` for a missing
    :data:`IDEMPOTENT`, a wrong budget, label or clock type, ``ValueError`` for a bad ``delay``,
    ``max_attempts`` or an empty label), before anything runs; it is a plain function returning the coroutine so
    that the call site keying the default budget is the caller's line even when the coroutine
    is wrapped in a task or ``gather``. Awaiting it returns or raises as :meth:`Hedge.execute`.
    """
    _check_idempotency(idempotency)
    # The policy built from these arguments is kept at the call site and reused while the same
    # objects come again (on the same ambient clock, for clock=None): building one per call
    # (validation, the budget's lookup, a metrics recorder) was most of hedge()'s cost. Identity,
    # not equality: an argument that would fail validation can never match one that passed.
    site = _site(_getframe(1))
    made = site.made
    if (made is None or made[0] is not delay or made[1] is not label or made[2] is not max_attempts
            or made[3] is not budget or made[4] is not clock
            or (clock is None and made[5]._clock is not current_clock())):
        policy = Hedge.__new__(Hedge)
        policy._setup(delay, max_attempts, budget, label, None, None, None, 1000, clock,
                      site.name if budget is RetryBudget.PER_CALL_SITE else "")
        made = site.made = (delay, label, max_attempts, budget, clock, policy)
    kept: Hedge = made[5]
    return kept._run(kept, fn, (), {})


# --- the engine ---------------------------------------------------------------------------------
#
# The first attempt runs inline, in the caller's own task, exactly like a bare ``await fn()``: a
# call that finishes before the delay costs one timer handle, an Attempt and a budget deposit,
# and no task at all. Hedges run as tasks. When a hedge wins while the first attempt is still
# running, the caller's task is cancelled with "superseded" (as asyncio.timeout cancels the task
# it guards) and the request is taken back with ``uncancel()`` once the first attempt has
# stopped; a cancellation from anyone else is told apart by the task's count of cancel requests.
#
# While the first attempt runs, decisions are made in callbacks (the hedge timer, hedge tasks
# finishing), in the call's context, captured at the start; afterwards the coroutine waits on a
# future those callbacks complete. Either way the rules are the ones in the module docstring.


class _Call:
    """One hedged call: what the callbacks need to decide, and what they decided."""

    __slots__ = (
        "args", "call_id", "decided", "end", "error", "fatal", "fn", "handle", "hedges", "kwargs",
        "policy", "primary_running", "spans", "start", "superseded", "task", "waiter", "wants", "winner", "finished",
    )

    handle: TimerHandle | None  # the pending hedge timer (set by _race before the first await)

    def __init__(self, policy: Hedge, task: asyncio.Task[Any], fn: Callable[..., Coroutine[Any, Any, Any]],
                 args: tuple[Any, ...], kwargs: dict[str, Any], wants: bool, start: int) -> None:
        # Only what the fast path needs; the rest is set when a hedge starts (_begin), or below.
        self.policy = policy
        self.task = task
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.wants = wants  # fn declares ``attempt``: each attempt gets ``attempt=`` by keyword
        self.call_id = ""  # drawn when first needed (shared_call_id)
        self.start = start
        # ``hedges`` stays None until a hedge starts: the fast path reads nothing else.
        self.hedges: list[asyncio.Task[Any]] | None = None

    def shared_call_id(self) -> str:
        """The id every attempt of this call shares, drawn on first use."""
        if not self.call_id:
            self.call_id = _new_call_id()
        return self.call_id

    def _begin(self) -> None:
        # The rest of the state, created when the first hedge starts.
        self.hedges = []
        # Per hedge, [start, end (-1 until it has run), its local waits (None: none known), its
        # coroutine until it starts]: a breaker outside the hedge leaves out only the time when
        # no attempt was on the dependency (_attribute_waits).
        self.spans: list[list[Any]] = []
        self.finished = 0  # attempts finished (the first attempt included)
        self.primary_running = True
        self.decided = False
        self.winner = 0  # the winning attempt's number; 0 while there is none
        self.error: BaseException | None = None  # the first failure in completion order
        # A KeyboardInterrupt, SystemExit or the like from a hedge (_stops_everything), or a
        # misused operation's TypeError: the call raises it once every attempt has stopped; it
        # is no attempt's failure.
        self.fatal: BaseException | None = None
        self.superseded = False  # the caller's task was cancelled because a hedge won
        self.end = 0
        self.waiter: asyncio.Future[None] | None = None

    # --- callbacks ---

    def on_timer(self) -> None:
        # In (a copy of) the call's context, as every Clock runs its timers (stoic.Clock): the
        # sinks, the deadline and the clock are the caller's.
        self.handle = None
        if self.hedges is not None and self.decided:
            return
        policy = self.policy
        clock = policy._clock
        delay_ns = policy._delay_ns
        left = remaining_ns(clock)  # (the same clock as at the call's start, checked there)
        if left is not None and left < delay_ns:
            if _SINKS.wants(Level.INFO):
                emit("hedge.deadline_skip", policy._label, Level.INFO, clock.now_ns(), {"attempts": self._started()})
            return
        if not policy._budget.try_spend():
            if _SINKS.wants(Level.WARNING):
                emit("hedge.budget_exhausted", policy._label, Level.WARNING, clock.now_ns(),
                     {"attempts": self._started()})
            return
        number = 2 if self.hedges is None else len(self.hedges) + 2
        try:
            if self.wants:
                coro = self.fn(*self.args, **self.kwargs, attempt=Attempt(number, self.shared_call_id(), True))
            else:
                coro = self.fn(*self.args, **self.kwargs)
        except Exception as exc:
            # Raised by calling the operation (a plain function building its coroutine): this
            # attempt's failure, as it is the first attempt's, not an error in a timer callback
            # (asyncio would log it, and the call would start no further hedge).
            coro = _raising(exc)
        else:
            if not asyncio.iscoroutine(coro):
                coro = _awaiting(coro)  # (any awaitable, or the await's TypeError: as for the first attempt)
        if self.hedges is None:
            self._begin()
        hedges = self.hedges
        assert hedges is not None
        now = clock.now_ns()
        span: list[Any] = [now, -1, None, coro]
        task = self.task.get_loop().create_task(_tracked(span, clock, coro))
        hedges.append(task)
        self.spans.append(span)
        task.add_done_callback(self.on_done)
        if _metrics.state.enabled:
            policy._rec.count_locked(("stoic.hedge.attempts",))
        if _SINKS.wants(Level.INFO):
            emit("hedge.started", policy._label, Level.INFO, now,
                 {"attempt": number, "elapsed": (now - self.start) / 1e9})
        if number < policy._max_attempts:
            self.handle = clock.call_at(now + delay_ns, self.on_timer)

    def on_done(self, task: asyncio.Task[Any]) -> None:
        """A hedge task finished (runs in a copy of the context it was started in)."""
        self.finished += 1
        hedges = self.hedges
        assert hedges is not None
        index = hedges.index(task)
        span = self.spans[index]
        if span[3] is not None:  # cancelled before it ran: the attempt's coroutine never started
            span[3].close()
            span[3] = None
            # Nothing was sent: the token that paid for this hedge comes back (a response landing
            # in the same loop iteration as the hedge timer, a caller cancelled just then).
            self.policy._budget._give_back()
        error = _error_of(task)  # (also marks its exception retrieved, so asyncio does not log it)
        try:
            if error is not None and _stops_everything(error):
                # As for the first attempt: the whole call stops, even after a decision (a loser
                # interrupted instead of finishing its cancellation), and nothing is reported as an
                # attempt's failure: the dependency did not fail.
                if self.fatal is None:
                    self._stop(error)
            elif error is not None and not self.decided and misused(error, self.fn):
                # The misuse rule: the call site's bug, not a slow or failing dependency. The call
                # stops as for a KeyboardInterrupt and raises it; this hedge's token comes back.
                self.policy._budget._give_back()
                self._stop(error)
            elif error is not None and not self.decided and is_defect(error):
                self._stop_on_defect(index + 2, error)
            elif not self.decided:
                number = index + 2
                if error is None:
                    self._win(number)
                else:
                    self._fail(number, error)
        finally:
            # (Even when a sink raised a BaseException from the report: the call is waiting.)
            waiter = self.waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    # --- decisions ---

    def _started(self) -> int:
        return 1 if self.hedges is None else len(self.hedges) + 1

    def _running(self) -> int:
        hedges = self.hedges
        assert hedges is not None
        return len(hedges) + 1 - self.finished

    def _stop_timer(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _win(self, number: int) -> None:
        self.decided = True
        self.winner = number
        self.end = self.policy._clock.now_ns()
        self._stop_timer()
        hedges = self.hedges
        assert hedges is not None
        for task in hedges:
            if not task.done():
                task.cancel(SUPERSEDED)
        if self.primary_running:
            self.superseded = True
            self.task.cancel(SUPERSEDED)

    def _stop_on_defect(self, number: int, error: BaseException) -> None:
        """Attempt ``number`` raised a :class:`stoic.Defect` (a bug in our code): never hedged
        past, as retry never retries one. Reported as its failure, then the call stops as for a
        misused operation (every other attempt cancelled and awaited) and raises it: another
        attempt's success must not paper over the bug."""
        if _SINKS.wants(Level.DEBUG):
            emit("hedge.attempt_failed", self.policy._label, Level.DEBUG, self.policy._clock.now_ns(),
                 {"attempt": number, "running": self._running(), "error.type": error_type(error)})
        self._stop(error)

    def _stop(self, error: BaseException) -> None:
        """A hedge raised ``error`` (KeyboardInterrupt, SystemExit..., or a misused operation's
        TypeError): cancel every other attempt, the first one (in the caller's task) included;
        the caller raises ``error`` once they stop."""
        self.fatal = error
        self.decided = True
        self._stop_timer()
        hedges = self.hedges
        assert hedges is not None
        for task in hedges:
            if not task.done():
                task.cancel()
        if self.primary_running and not self.superseded:
            self.superseded = True  # our own request on the caller's task, taken back as a win's is
            self.task.cancel()

    def _fail(self, number: int, error: BaseException) -> None:
        running = self._running()
        policy = self.policy
        if self.error is None:
            self.error = error
        if running == 0:
            # Nothing left in flight: a failure is retry's business, never a reason to hedge.
            self.decided = True
            self._stop_timer()
        # Reported once recorded: a sink's BaseException (its Exception is skipped) cannot leave
        # the call undecided.
        if _SINKS.wants(Level.DEBUG):
            emit("hedge.attempt_failed", policy._label, Level.DEBUG, policy._clock.now_ns(),
                 {"attempt": number, "running": running, "error.type": error_type(error)})

    def abandon(self) -> None:
        """The caller is leaving (cancelled, or an error of its own): cancel every hedge."""
        self._stop_timer()
        if self.hedges is not None:
            self.decided = True
            for task in self.hedges:
                if not task.done():
                    task.cancel()

    async def settle(self) -> bool:
        """Wait until decided and every hedge has finished, through cancellation (which would
        otherwise leave attempts running after the call returns). True if the caller was
        cancelled meanwhile: the caller raises it once everything has stopped."""
        cancelled = False
        hedges = self.hedges
        assert hedges is not None
        while not self.decided or self.finished < len(hedges) + 1:
            waiter = self.waiter = self.task.get_loop().create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                cancelled = True
                self.abandon()
            except GeneratorExit:  # closed while waiting: nothing more may be awaited
                self.abandon()
                raise
        return cancelled


async def _tracked(span: list[Any], clock: Clock, coro: Coroutine[Any, Any, Any]) -> Any:
    """A hedge's coroutine, noting in ``span`` (see _Call.spans) that it started, when it ended
    and the local waits its task recorded (in its own context) while it ran."""
    span[3] = None
    try:
        return await coro
    finally:
        span[1] = clock.now_ns()
        if _admission.state.waits:
            span[2] = _admission.waits_after(clock, span[0])


def _outside(start: int, end: int, spans: list[tuple[int, int]] | None, into: list[tuple[int, int]]) -> None:
    """Append to ``into`` the parts of ``[start, end]`` outside ``spans`` (``(since, until)``
    pairs, overlapping or not, in any order): an attempt's time on the dependency outside its
    waits, or the call's idle time outside every attempt's busy time."""
    at = start
    for since, until in sorted(spans or ()):
        since, until = max(since, start), min(until, end)
        if since > at:
            into.append((at, since))
        at = max(at, until)
    if end > at:
        into.append((at, end))


def _attribute_waits(call: _Call, primary_end: int) -> None:
    """Field report 20 for a hedged call: the first attempt's waits were recorded in the
    caller's context as the call's local queueing, though a hedge may have been on the dependency
    meanwhile (a first attempt queued at a busy replica, or superseded in the queue, while a
    hedge waited 2 s for the dependency elsewhere: a breaker outside saw a quick call). Only the
    time when no attempt was on the dependency is left out: the caller's waits after the call's
    start are replaced by the gaps between the attempts' busy times."""
    clock = call.policy._clock
    start = call.start
    now = clock.now_ns()
    busy: list[tuple[int, int]] = []
    _outside(start, primary_end, _admission.waits_after(clock, start), busy)
    hedges = call.hedges or ()
    for task, span in zip(hedges, call.spans, strict=True):  # (appended together)
        if span[1] >= 0:
            _outside(span[0], span[1], span[2], busy)
        elif span[3] is None and not task.done():  # (still running: on the dependency until now)
            busy.append((span[0], now))
    idle: list[tuple[int, int]] = []
    _outside(start, now, busy, idle)
    _admission.replace_waits_after(clock, start, idle)


async def _raising(error: Exception) -> Any:
    raise error


async def _awaiting(awaitable: Any) -> Any:
    return await awaitable


def _error_of(task: asyncio.Task[Any]) -> BaseException | None:
    if task.cancelled():
        # Cancelled by something other than this hedge (which only cancels once decided): that
        # is this attempt's outcome, like any other failure.
        try:
            task.result()
        except asyncio.CancelledError as exc:
            return exc
    return task.exception()


def _stops_everything(error: BaseException) -> bool:
    """``KeyboardInterrupt``, ``SystemExit`` and the like, bare or anywhere inside exception
    groups: the whole call stops for them. A ``CancelledError`` (or a group of nothing else) and
    ordinary exceptions are an attempt's outcome."""
    if isinstance(error, (Exception, asyncio.CancelledError)):
        return False
    return any(not isinstance(leaf, (Exception, asyncio.CancelledError)) for leaf in leaves(error))


async def _race(policy: Hedge, fn: Callable[..., Coroutine[Any, Any, R]], args: tuple[Any, ...],
                kwargs: dict[str, Any], deposit: bool = True) -> R:
    """One hedged call. ``deposit``: the call's request is to be deposited for (False where it
    is already counted on the hedge's budget: :func:`_race_marked`)."""
    clock = policy._clock
    if _deadline.ever_set and _deadline_scope.get() is not None:
        left = remaining_ns(clock)
        if left is not None and left <= 0:
            # A refusal, reported as the breaker's, bulkhead's and limiter's are: no attempt started.
            if _SINKS.wants(Level.INFO):
                emit("hedge.deadline_skip", policy.label, Level.INFO, clock.now_ns(), {"attempts": 0})
            raise DeadlineExceeded("deadline exceeded before the hedged call started", label=policy.label)
    task = _caller_task()
    if task is None:
        task = asyncio.current_task(asyncio.get_running_loop())  # (raises outside a running loop)
        if task is None:
            raise RuntimeError("hedge must run inside an asyncio task")
    loop = task.get_loop()
    if deposit:
        next(policy._budget._deposits)  # the call's deposit (RetryBudget.deposit, inlined)
    system = type(clock) is SystemClock
    start = clock.now_ns()
    op = policy.op
    wants = (op[1] if getattr(fn, "__code__", None) is op[0] else _learn_op(policy, fn)) and "attempt" not in kwargs
    call = _Call(policy, task, fn, args, kwargs, wants, start)
    # Compared with the count at the end: a cancel request swallowed before this call (a
    # TaskGroup on 3.11, a library without uncancel()) is not this caller being cancelled.
    cancels = task.cancelling()
    # A timer handle, not a timer task.
    if system:  # (call_at: call_later is call_at(time() + delay) behind one more call)
        call.handle = loop.call_at(loop.time() + policy._delay_ns / 1e9, call.on_timer)
    else:
        call.handle = clock.call_at(start + policy._delay_ns, call.on_timer)
    try:
        # With no arguments (hedge(), and most execute calls), a direct call: no argument
        # tuple and dictionary to unpack.
        if wants:
            if args or kwargs:
                result = await fn(*args, **kwargs, attempt=_first_attempt(call))
            else:
                result = await fn(attempt=_first_attempt(call))
        elif args or kwargs:
            result = await fn(*args, **kwargs)
        else:
            result = await fn()
    except BaseException as exc:
        if call.hedges is None:
            # No hedge ever started: the first attempt's outcome is the call's.
            if call.handle is not None:
                call.handle.cancel()
            if misused(exc, fn):
                # The misuse rule (stoic._errors.misused): the call site's bug, raised at once
                # with no attempt reported, and the deposit of a call that never reached the
                # dependency taken back.
                if deposit:
                    policy._budget._take_back()
                close_unrun(fn)
                raise
            if _SINKS.wants(Level.DEBUG) and isinstance(exc, Exception):
                emit("hedge.attempt_failed", policy._label, Level.DEBUG, clock.now_ns(),
                     {"attempt": 1, "running": 0, "error.type": error_type(exc)})
            raise
        return await _after_primary(call, cancels, None, exc)
    if call.hedges is None:
        # The common case: the first attempt succeeded before any hedge started.
        if call.handle is not None:
            call.handle.cancel()
        if policy._estimate is not None:
            policy._observe(clock.now_ns() - start)
        return result
    return await _after_primary(call, cancels, result, None)


async def _race_marked(policy: Hedge, fn: Callable[..., Coroutine[Any, Any, R]], args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> R:
    """:func:`_race` for a hedge on a budget that was given, which a retry may share: the call's
    attempts are marked (stoic._retry, "A hedge on a budget it was given") so that a retry
    started in one on this budget makes no deposit, its first attempt being this call's request
    (the hedge deposits for it) or a hedge (paid for with a token). The other way round, a call
    started in a running retry attempt, or another hedge's call, on this budget deposits nothing:
    its first attempt is that request, already counted (stoic._retry._counted_on). The mark is
    set in the caller's context before the hedge timer copies it, so the hedges' tasks hold it
    too; when the call ends it is taken back and its budget cleared (a task an attempt left
    behind still holds it). One context-variable write and a coroutine frame per call: a hedge on
    its own per-call-site budget (the default) does without."""
    budget = policy._budget
    mark = [0, _IDLE, budget, 1]
    token = _set_marks(mark)
    old = token.old_value
    if old is not _NO_MARK:
        mark[1] = old
    try:
        return await _race(policy, fn, args, kwargs, old is _NO_MARK or not _counted_on(old, budget))
    finally:
        mark[2] = None
        try:
            _reset_marks(token)
        except ValueError:  # (closed from another context: nothing of ours is set there)
            pass


def _take_fatal(call: _Call) -> BaseException:
    fatal = call.fatal
    assert fatal is not None
    call.fatal = None  # (no cycle through the call's state once it is raised)
    return fatal


async def _after_primary(call: _Call, cancels: int, result: R | None, exc: BaseException | None) -> R:
    """The first attempt has finished (``result`` or ``exc``) and at least one hedge started."""
    primary_end = call.policy._clock.now_ns()
    try:
        return await _after_first(call, cancels, result, exc)
    finally:
        if _admission.state.waits and not isinstance(exc, GeneratorExit):
            _attribute_waits(call, primary_end)


async def _after_first(call: _Call, cancels: int, result: R | None, exc: BaseException | None) -> R:
    """:func:`_after_primary`'s decisions."""
    call.primary_running = False
    call.finished += 1
    policy = call.policy
    cancelled = False
    if call.superseded:
        # A hedge won and cancelled us: take that request back. Any count left over is someone
        # else's cancellation, which goes through once everything has stopped.
        cancelled = call.task.uncancel() > cancels
    elif exc is not None and _deadline.cancelled_since(call.task, cancels, exc):
        # The caller was cancelled (or its deadline fired), whatever the first attempt made of
        # it: a client that turns the CancelledError into an error of its own must not leave
        # the call waiting for a hedge and returning its value to a caller that asked to stop.
        cancelled = True
    if isinstance(exc, GeneratorExit):
        # The call's coroutine is being closed (coro.close(), or collected while suspended): it
        # may not await again (that would raise "coroutine ignored GeneratorExit" in place of
        # the close), so the hedges are cancelled, not awaited.
        call.abandon()
        raise exc
    if exc is not None and _stops_everything(exc):
        call.abandon()  # KeyboardInterrupt, SystemExit (bare or in a group): stop everything
        await call.settle()
        raise exc
    if call.fatal is not None:  # a hedge's (see _stop): every attempt is stopping already
        await call.settle()
        raise _take_fatal(call)
    if cancelled:
        call.abandon()
    elif not call.decided:
        if exc is None:
            call._win(1)
        elif is_defect(exc):
            call._stop_on_defect(1, exc)  # (never hedged past: see _Call._stop_on_defect)
        else:
            call._fail(1, exc)
    settled_cancelled = await call.settle()
    if call.fatal is not None:  # a hedge's, while waiting: it outranks a cancellation, as above
        raise _take_fatal(call)
    if settled_cancelled and not cancelled:
        # Cancelled while waiting for the hedges: the first attempt's outcome is not the
        # caller's to see.
        raise asyncio.CancelledError
    if cancelled:
        if exc is not None:
            raise exc  # the CancelledError, or what the first attempt turned it into
        raise asyncio.CancelledError
    if call.winner == 0:
        error = call.error
        assert error is not None
        call.error = None
        if _SINKS.wants(Level.WARNING):
            emit("hedge.all_failed", policy._label, Level.WARNING, policy._clock.now_ns(),
                 {"attempts": call._started(), "error.type": error_type(error)})
        raise error
    hedges = call.hedges
    assert hedges is not None
    clock = policy._clock
    if call.winner == 1:
        value = cast(R, result)
        if policy._estimate is not None:
            policy._observe(call.end - call.start)
    else:
        value = cast(R, hedges[call.winner - 2].result())
        if policy._estimate is not None and call.superseded:
            # The first attempt was still running when a hedge won: its latency is at least this
            # (which is past the delay). Left out, the slowest primaries would pull the estimate
            # under its quantile (p86 for p95 on lognormal latencies); counted at this bound, the
            # share of primaries faster than the delay is exact, so the delay settles on it.
            policy._observe(call.end - call.start)
    if _metrics.state.enabled:
        policy._rec.count_locked(("stoic.hedge.wins", str(call.winner)))
    if _SINKS.wants(Level.INFO):
        emit("hedge.won", policy._label, Level.INFO, clock.now_ns(),
             {"attempt": call.winner, "started": len(hedges) + 1, "latency": (call.end - call.start) / 1e9})
    return value
