"""What to do with a failed attempt: retry decisions and classifiers (seed 001, "Default
classification")."""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable
from datetime import timedelta
from typing import ClassVar, Protocol, TypeAlias, runtime_checkable

from ._durations import Seconds, to_ns
from ._errors import BudgetExhausted, DeadlineExceeded, Rejected, client_transient, leaves
from ._policy import plain_verdict, refuse_async_callback

_MAX_NS = 2**63 - 1  # every wait saturates here (as schedules do); retry caps it at five minutes anyway


class RetryDecision:
    """A classifier's verdict on one failed attempt.

    :data:`RETRY` (wait as the schedule says, then try again), :data:`STOP` (raise the error
    now), or :meth:`retry_after` (wait this long instead of the schedule's delay; the schedule's
    bound, the budget and the deadline still apply, and the wait is capped at five minutes).
    """

    __slots__ = ("_after_ns", "_kind")

    RETRY: ClassVar[RetryDecision]
    STOP: ClassVar[RetryDecision]

    _kind: str
    _after_ns: int | None

    def __init__(self, kind: str, after_ns: int | None = None) -> None:
        # Private: use RETRY, STOP or retry_after().
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_after_ns", after_ns)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("RetryDecision is immutable")

    # A value: copies are itself, and pickle rebuilds it (RETRY and STOP as the singletons)
    # rather than setting its slots through the refused __setattr__.
    def __reduce__(self) -> tuple[Callable[[str, int | None], RetryDecision], tuple[str, int | None]]:
        return _rebuild, (self._kind, self._after_ns)

    def __copy__(self) -> RetryDecision:
        return self

    def __deepcopy__(self, memo: object) -> RetryDecision:
        return self

    @staticmethod
    def retry_after(seconds: Seconds) -> RetryDecision:
        """Retry after ``seconds`` (float or timedelta) in place of the schedule's delay.

        A wait of zero or less (a server's ``Retry-After`` already in the past, clock skew)
        means "retry now on the schedule": it returns :data:`RETRY`, and so does a positive
        wait that rounds to zero nanoseconds. Longer waits saturate at
        about 292 years (retry caps them at five minutes, ``retry.after_capped``). Raises
        ``ValueError`` naming ``seconds`` for NaN, ``TypeError`` for a non-number."""
        if isinstance(seconds, timedelta):
            if seconds <= timedelta(0):
                return RetryDecision.RETRY
            # Exact in microseconds (as to_ns converts it), saturating like a number: to_ns
            # refuses a timedelta past MAX_SECONDS, and timedelta reaches about 8.6e13 s.
            ns = ((seconds.days * 86_400 + seconds.seconds) * 1_000_000 + seconds.microseconds) * 1_000
            return RetryDecision("retry_after", min(_MAX_NS, ns))
        elif isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"seconds must be a number of seconds or a timedelta, got {type(seconds).__name__}")
        elif isinstance(seconds, int):  # exact, however large (a float conversion could overflow)
            return RetryDecision.RETRY if seconds <= 0 else RetryDecision("retry_after", min(_MAX_NS, seconds * 10**9))
        elif math.isnan(seconds):
            raise ValueError(f"seconds must be a number of seconds (not NaN), got {seconds!r}")
        elif seconds <= 0:
            return RetryDecision.RETRY
        elif seconds * 1e9 >= _MAX_NS:
            return RetryDecision("retry_after", _MAX_NS)
        # A positive wait below half a nanosecond (a float difference of two instants) rounds
        # to no wait at all: "now", as zero means, never to_ns's ValueError for a zero duration.
        ns = to_ns(seconds, "seconds", allow_zero=True)
        return RetryDecision.RETRY if ns == 0 else RetryDecision("retry_after", min(_MAX_NS, ns))

    @property
    def retries(self) -> bool:
        """Whether this decision allows another attempt."""
        return self._kind != "stop"

    @property
    def after(self) -> float | None:
        """Seconds to wait for a ``retry_after`` decision, else ``None``."""
        return None if self._after_ns is None else self._after_ns / 1e9

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RetryDecision):
            return NotImplemented
        return (self._kind, self._after_ns) == (other._kind, other._after_ns)

    def __hash__(self) -> int:
        return hash((self._kind, self._after_ns))

    def __repr__(self) -> str:
        if self._after_ns is not None:
            return f"RetryDecision.retry_after({self._after_ns / 1e9!r})"
        return f"RetryDecision.{self._kind.upper()}"


RetryDecision.RETRY = RetryDecision("retry")
RetryDecision.STOP = RetryDecision("stop")


def _rebuild(kind: str, after_ns: int | None) -> RetryDecision:
    """The decision ``kind`` (after ``after_ns``) as unpickled: RETRY and STOP are the singletons."""
    if after_ns is None and kind in ("retry", "stop"):
        return RetryDecision.RETRY if kind == "retry" else RetryDecision.STOP
    return RetryDecision(kind, after_ns)


@runtime_checkable
class Retryable(Protocol):
    """An exception that knows whether retrying it can help: it has a ``retry_decision``
    attribute (a :class:`RetryDecision`). The standard classifier obeys it."""

    @property
    def retry_decision(self) -> RetryDecision: ...


class RetryNesting(enum.Enum):
    """What a retry does when it starts inside another retry's attempt (seed 001, "Nesting").

    ``SINGLE_ATTEMPT`` (the default) makes one attempt and raises its error, so only the
    outermost layer retries (five layers of three attempts make 3 calls, not 243). ``ALLOW``
    retries anyway: for a layer that retries a different dependency than the one around it.
    """

    SINGLE_ATTEMPT = "single_attempt"
    ALLOW = "allow"


_Verdict: TypeAlias = RetryDecision | bool

# The same bytes fail the same way: decoding and encoding errors never get better by retrying.
_DETERMINISTIC: tuple[type[BaseException], ...] = (UnicodeError, json.JSONDecodeError)
# Errors that mean the calling code is wrong, not the dependency.
_PROGRAMMING: tuple[type[BaseException], ...] = (
    TypeError, AttributeError, NameError, AssertionError, NotImplementedError,
)
_STOP_TYPES = (*_DETERMINISTIC, *_PROGRAMMING)
_TRANSIENT: tuple[type[BaseException], ...] = (TimeoutError, ConnectionError)


def _own_decision(error: BaseException) -> RetryDecision | None:
    decision = getattr(error, "retry_decision", None)
    return decision if isinstance(decision, RetryDecision) else None


_LONGEST_AFTER_S = 1e12  # seconds: far above retry's five-minute cap, and exact in integer ns


def _rejection(error: Rejected) -> RetryDecision:
    if isinstance(error, BudgetExhausted):
        return RetryDecision.STOP  # an inner budget ran dry: another attempt spends what is not there
    if isinstance(error, DeadlineExceeded):
        return RetryDecision.RETRY  # an attempt timeout: transient (the ambient deadline is checked apart)
    if error.retry_after is not None and error.retry_after > 0:
        # Clamped before the conversion: an infinite (or ~1e300 s) retry_after would raise
        # OverflowError in place of the attempt's error. Anything this long is capped at five
        # minutes by retry anyway (retry.after_capped).
        ns = round(min(error.retry_after, _LONGEST_AFTER_S) * 1e9)
        if ns > 0:  # (below half a nanosecond it is zero: "now", as retry_after() says too)
            return RetryDecision("retry_after", ns)
    return RetryDecision.RETRY  # unknown, or zero: "now", on the schedule (as retry_after(0) means)


def _standard(error: BaseException) -> RetryDecision:
    decision = _own_decision(error)
    if decision is not None:
        return decision
    if isinstance(error, Rejected):
        return _rejection(error)
    if isinstance(error, _STOP_TYPES):
        return RetryDecision.STOP
    return RetryDecision.RETRY


def _transient_only(error: BaseException) -> RetryDecision:
    decision = _own_decision(error)
    if decision is not None:
        return decision
    if isinstance(error, Rejected):
        return _rejection(error)
    if isinstance(error, _TRANSIENT) or client_transient(error):  # (httpx's, aiohttp's too)
        return RetryDecision.RETRY
    return RetryDecision.STOP


def _never(error: BaseException) -> RetryDecision:
    return RetryDecision.STOP


def _combine(decisions: list[RetryDecision]) -> RetryDecision:
    """The verdict on an exception group from its leaves' (docs/design.md, "Exception groups"):
    retried only if every leaf is, after the longest wait any leaf asks for."""
    after: int | None = None
    for decision in decisions:
        if not decision.retries:
            return RetryDecision.STOP
        if decision._after_ns is not None and (after is None or decision._after_ns > after):
            after = decision._after_ns
    return RetryDecision.RETRY if after is None else RetryDecision("retry_after", after)


def _by_leaves(judge: Callable[[BaseException], RetryDecision]) -> Callable[[BaseException], RetryDecision]:
    """``judge`` applied to an exception group's leaves (a group's own ``retry_decision``,
    when it has one, decides first); to any other error, as is."""

    def judged(error: BaseException) -> RetryDecision:
        if not isinstance(error, BaseExceptionGroup):
            return judge(error)
        decision = _own_decision(error)
        if decision is not None:
            return decision
        found = leaves(error)
        return _combine([judge(leaf) for leaf in found]) if found else judge(error)

    judged.__qualname__ = getattr(judge, "__qualname__", "judged")
    return judged


class RetryClassifier:
    """Decides, per failed attempt, whether to retry (seed 001, "Default classification").

    ``RetryClassifier(fn)`` wraps ``fn(error) -> RetryDecision | bool`` (``True`` retries).
    Whatever the classifier says, a :class:`stoic.Defect` is never retried, and cancellation
    never reaches it (``asyncio.CancelledError`` is not an ``Exception``).

    Exception groups (docs/design.md, "Exception groups"): the built-in classifiers and the
    exception-type ones judge a group by its leaves (:func:`stoic._errors.leaves`): it is
    retried only if every leaf would be, waiting the longest ``retry_after`` any leaf asks
    for; a group with its own ``retry_decision`` decides for itself; a group with any
    :class:`stoic.Defect` leaf is never retried. A classifier you write receives the group
    itself. If your classifier (or an error's ``retry_decision``) raises, or hands back an
    awaitable (a lambda around an async predicate: never awaited), retry stops and
    re-raises the operation's own error, with the classifier's chained as its ``__context__``
    and reported once (``warnings`` and the ``"stoic"`` logger).

    - :data:`standard` (the default): an error with a ``retry_decision`` (:class:`Retryable`)
      decides; stops on ``UnicodeError`` and ``json.JSONDecodeError`` (the same bytes fail the
      same way) and on programming errors (``TypeError``, ``AttributeError``, ``NameError``,
      ``AssertionError``, ``NotImplementedError``); stops on :class:`stoic.BudgetExhausted`;
      honours a rejection's ``retry_after`` (an open breaker's, a rate limiter's); treats
      :class:`stoic.DeadlineExceeded` (an attempt timeout) as transient; retries anything else.
      Every other safety net is on by default (bounded schedule, per-call-site budget, nested
      retries collapse), so an unknown error costs a few bounded attempts, not an outage.
    - :data:`transient_only`: a ``retry_decision`` decides; rejections as above;
      ``TimeoutError`` and ``ConnectionError`` retry, and the HTTP clients' timeouts and
      connection failures that are neither (``stoic._errors.client_transient``: httpx's,
      aiohttp's); everything else stops.
    - :data:`never`: always stop (one attempt, keeping retry's events and nesting mark).
    """

    __slots__ = ("_fn", "name")

    standard: ClassVar[RetryClassifier]
    transient_only: ClassVar[RetryClassifier]
    never: ClassVar[RetryClassifier]

    def __init__(self, fn: Callable[[BaseException], _Verdict], *, name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"a classifier must be callable, got {type(fn).__name__}")
        refuse_async_callback(fn, "classify", "a RetryDecision or a bool")
        self._fn = fn
        self.name = name or getattr(fn, "__qualname__", type(fn).__qualname__)

    def __call__(self, error: BaseException) -> RetryDecision:
        verdict = self._fn(error)
        if isinstance(verdict, RetryDecision):
            return verdict
        # A plain function handing back an async predicate's coroutine (a lambda around an async
        # def): never awaited, and always true, it retried every error. Refused as the
        # classifier's failure: retry stops and keeps the operation's error.
        return RetryDecision.RETRY if plain_verdict(verdict, f"the classifier {self.name}") else RetryDecision.STOP

    def __repr__(self) -> str:
        return f"RetryClassifier.{self.name}" if self.name in ("standard", "transient_only", "never") \
            else f"RetryClassifier({self.name})"


RetryClassifier.standard = RetryClassifier(_by_leaves(_standard), name="standard")
RetryClassifier.transient_only = RetryClassifier(_by_leaves(_transient_only), name="transient_only")
RetryClassifier.never = RetryClassifier(_never, name="never")

ClassifierLike: TypeAlias = (
    RetryClassifier | Callable[[BaseException], RetryDecision | bool] | type[BaseException]
    | tuple[type[BaseException], ...]
)


def as_classifier(classify: ClassifierLike) -> RetryClassifier:
    """Accept a classifier, a callable, or exception type(s) to retry (all others stop)."""
    if isinstance(classify, RetryClassifier):
        return classify
    if isinstance(classify, type) and issubclass(classify, BaseException):
        types: tuple[type[BaseException], ...] = (classify,)
    elif isinstance(classify, tuple) and all(isinstance(t, type) and issubclass(t, BaseException) for t in classify):
        types = classify
    elif callable(classify):
        return RetryClassifier(classify)  # type: ignore[arg-type]
    else:
        raise TypeError(f"classify must be a RetryClassifier, a callable or exception types, got {classify!r}")

    def _on(error: BaseException) -> RetryDecision:
        decision = _own_decision(error)
        if decision is not None:
            return decision
        return RetryDecision.RETRY if isinstance(error, types) else RetryDecision.STOP

    return RetryClassifier(_by_leaves(_on), name=f"on({', '.join(t.__name__ for t in types)})")
