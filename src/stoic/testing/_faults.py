"""Fault-injecting operations for tests: fail n times then succeed, always fail, hang."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Generic, TypeVar

from .._clock import current_clock
from .._durations import Seconds, check_int, to_ns

T = TypeVar("T")

ErrorSpec = BaseException | type[BaseException] | Callable[[], BaseException]


def _make_error(spec: ErrorSpec) -> BaseException:
    if isinstance(spec, BaseException):
        # A fresh copy per raise (same type, args and attributes) so tracebacks do not pile up.
        # copy.copy rebuilds it as type(spec)(*spec.args), which fails for an exception whose
        # __init__ takes other arguments than it passes on (HTTPError(status, message), a
        # keyword-only response=) and calls __init__ again on args it derived (a message built
        # from a code): then make it without __init__, and keep the original args either way.
        try:
            error = copy.copy(spec)
        except Exception:
            error = type(spec).__new__(type(spec), *spec.args)
            if hasattr(spec, "__dict__"):
                error.__dict__.update(spec.__dict__)
        error.args = spec.args
        return error
    error = spec()
    if not isinstance(error, BaseException):
        raise TypeError(f"the error factory returned {error!r}, not an exception")
    return error


_END_OF_TIME = 2**63 - 1  # the last instant a clock can reach (ns): a blocking sleep until then hangs


class FaultyOperation(Generic[T]):
    """An async operation (``await op(*args, **kwargs)``; ``op.sync(...)`` is the plain form)
    whose first ``failures`` calls raise, after which it returns ``result``; ``failures=None``
    raises for ever; ``hang=True`` never returns (until cancelled; the plain form, which nothing
    can cancel, blocks its thread on the ambient clock for good).

    Each call first takes ``takes`` seconds on the ambient clock (virtual in tests). Records
    ``calls``, ``started_at`` (clock seconds at each call's start) and ``raised`` (the exceptions
    raised, in order, so a test can check identity with what the caller caught).
    """

    wants_attempt = False  # never handed an Attempt by retry

    def __init__(self, failures: int | None, error: ErrorSpec, result: T, *, takes: Seconds = 0,
                 hang: bool = False) -> None:
        self.failures = None if failures is None else check_int(failures, "failures", minimum=0)
        self.error = error
        self.result = result
        self.takes_ns = to_ns(takes, "takes", allow_zero=True)
        self.hang = hang
        self.calls = 0
        self.started_at: list[float] = []
        self.raised: list[BaseException] = []

    def _outcome(self, call: int) -> T:
        # ``call`` is this call's number, taken at its start: calls that overlap (takes > 0) end
        # in another order than they began, and it is the first ``failures`` to begin that fail.
        if self.failures is None or call <= self.failures:
            error = _make_error(self.error)
            self.raised.append(error)
            raise error
        return self.result

    async def __call__(self, *args: object, **kwargs: object) -> T:
        clock = current_clock()
        self.calls += 1
        call = self.calls
        self.started_at.append(clock.now_ns() / 1e9)
        if self.hang:
            await asyncio.get_running_loop().create_future()  # never completes; cancellable
        if self.takes_ns:
            await clock.sleep_until(clock.now_ns() + self.takes_ns)
        return self._outcome(call)

    def sync(self, *args: object, **kwargs: object) -> T:
        """The plain-function form (blocking sleeps on the ambient clock)."""
        clock = current_clock()
        self.calls += 1
        call = self.calls
        self.started_at.append(clock.now_ns() / 1e9)
        if self.hang:
            clock.sleep_until_blocking(_END_OF_TIME)  # (a VirtualClock refuses where no one could move it)
        if self.takes_ns:
            clock.sleep_until_blocking(clock.now_ns() + self.takes_ns)
        return self._outcome(call)

    def __repr__(self) -> str:
        return f"FaultyOperation(failures={self.failures}, calls={self.calls})"


def fail_times(n: int, exc: ErrorSpec = ConnectionError, *, then: T = None,  # type: ignore[assignment]
               takes: Seconds = 0) -> FaultyOperation[T]:
    """An operation that raises ``exc`` (an instance, a type or a factory) on its first ``n``
    calls, then returns ``then``. Each call takes ``takes`` seconds on the ambient clock."""
    return FaultyOperation(n, exc, then, takes=takes)


def fail_with(exc: ErrorSpec, *, takes: Seconds = 0) -> FaultyOperation[None]:
    """An operation that always raises ``exc`` (e.g. an exception whose ``retry_decision`` is
    ``RetryDecision.STOP``)."""
    return FaultyOperation(None, exc, None, takes=takes)


def hang() -> FaultyOperation[None]:
    """An operation that never finishes until cancelled (by a deadline or its caller); its plain
    form ``.sync`` never finishes at all (it blocks its thread on the ambient clock)."""
    return FaultyOperation(0, ConnectionError, None, hang=True)
