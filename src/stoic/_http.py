"""The rules every HTTP client integration shares (stoic.httpx, stoic.aiohttp): which responses
are failures, what a ``Retry-After`` means, which methods may be retried or hedged, and the
order the policies run in. The adapters only map their framework's request and response to
these; no rule is written twice.

Order per request, outermost first: ``Retrying`` (idempotent methods only) -> ``Hedge``
(idempotent methods only, and only a request whose body two attempts can send at once: none,
or bytes in memory; a stream or a file would be read by both) -> the stages as given (typically
breaker -> limiter -> bulkhead), each a policy or a :class:`stoic.Keyed` family resolved by the
request's key -> one attempt.

Bodies: a request is retried only when a second attempt sends its body identically: no body,
bytes in memory, a file that can seek back (:func:`seekable`), or a multipart form made only of
those. Any other body (a stream, an iterator, a file that cannot seek back, a form with such a
part, a kind of body the adapter does not know) is sent once: not retried, not hedged, still
run through the stages. Connections: a failed response whose request is retried is released
before the backoff sleep, read first when that costs little (:func:`drain_first`: it has no
body by HTTP, or its body is known small) so its connection is reused, else closed unread. The
read gets at most :data:`DRAIN_TIMEOUT`; a body that has not come by then is closed instead.
The caller never gets such a response back (after the backoff the next attempt's result or
error is the answer). A failed response returned because no retry follows is left as it came,
readable.
"""

from __future__ import annotations

import datetime
import email.utils
import inspect
import math
import re
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from ._callbacks import callback_failed
from ._classify import RetryDecision
from ._durations import Seconds, to_ns, to_seconds
from ._errors import RateLimited
from ._policy import Policy, plain_verdict, refuse_async_callback
from .hedge import IDEMPOTENT, Hedge
from .keyed import Keyed
from .pipeline import Retrying, retrying_in

if TYPE_CHECKING:
    import asyncio
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

__all__ = ["IDEMPOTENT_METHODS", "HTTPPolicies", "ServerError", "TooManyRequests", "parse_retry_after"]

Resp = TypeVar("Resp")

IDEMPOTENT_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
"""Methods RFC 9110 calls idempotent: the only ones retried or hedged unless told otherwise."""

DEFAULT_RETRY_AFTER_CAP: Final = 300.0  # seconds: retry's own cap on a retry_after wait
DRAIN_LIMIT: Final = 64 * 1024
"""Bytes: the largest failed response body (by its ``Content-Length``) read before a retry's
backoff so its connection is reused; a larger or unsized one is closed, its connection dropped."""
DRAIN_TIMEOUT: Final = 0.1
"""Seconds: the longest a failed response's body is read for before a retry's backoff (see
:data:`DRAIN_LIMIT`); a body not in by then (a server that stalls after its headers) is closed
instead, its connection dropped. The read runs within the backoff (whose end is fixed before
it), so it delays the next attempt only by what it takes beyond the backoff's own sleep. A
small body normally arrives with its headers or right after; missing it costs the next attempt
one new connection."""
_ASCTIME: Final = re.compile(r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2} [0-9]{4}")


def parse_retry_after(value: str | None, *, cap: float = DEFAULT_RETRY_AFTER_CAP,
                      now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delay-seconds (ASCII digits) or an HTTP
    date in any of its three forms (RFC 9110 10.2.3, 5.6.7), clamped to ``[0, cap]``. ``None``
    when absent or malformed (never raises).
    ``now`` is the wall-clock time (``time.time()``) a date is measured from."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isascii() and text.isdigit():
        # float(), not int(): a value of thousands of digits is inf (then the cap), where int()
        # raises ValueError past 4,300 digits and float(int) OverflowError past 308.
        return min(float(text), cap)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        # An HTTP date is always GMT. The one form that does not say so is asctime's (RFC 9110
        # 5.6.7: a recipient must accept it); any other date without a zone is not an HTTP date.
        if not _ASCTIME.fullmatch(text):
            return None
        when = when.replace(tzinfo=datetime.UTC)
    seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), cap)


class ServerError(Exception):
    """An attempt answered with a server error (5xx by default): a failure the breaker counts.

    ``status``, ``retry_after`` (seconds from a 503's ``Retry-After``, else ``None``) and
    ``response`` (the framework's response object; the integration closes it when the request
    is retried, and returns it to the caller when no attempt is left). A ``retry_after`` is
    honoured by the retry stage in place of the schedule's delay (``retry_decision``).
    """

    def __init__(self, status: int, response: Any, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.response = response
        self.retry_after = retry_after

    @property
    def retry_decision(self) -> RetryDecision:
        return RetryDecision.RETRY if self.retry_after is None else RetryDecision.retry_after(self.retry_after)


class TooManyRequests(RateLimited):
    """An attempt answered 429: the server's rate limit refused it. A :class:`stoic.RateLimited`
    (so the breaker ignores it: the dependency is not failing) whose ``retry_after`` comes from
    the ``Retry-After`` header; ``label`` is the request's key, ``response`` as for
    :class:`ServerError`. An :class:`stoic.AdaptiveThrottle` counts it as a request the server did
    not accept (unlike a local policy's refusal, it reached the server)."""

    _by_dependency = True

    def __init__(self, response: Any, *, label: str | None, retry_after: float | None) -> None:
        super().__init__(label=label, retry_after=retry_after)
        self.status = 429
        self.response = response


class HTTPPolicies(Generic[Resp]):
    """The policies one client applies to every request, and the request-level rules.

    ``stages``: policies (``CircuitBreaker``, ``RateLimiter``, ``Bulkhead``, ...) or
    :class:`stoic.Keyed` families of them, outermost first; ``retry``: a :class:`stoic.Retrying`
    or ``None``; ``hedge``: a :class:`stoic.Hedge` or ``None`` (async only);
    ``retry_methods``: methods that may be retried and hedged (default
    :data:`IDEMPOTENT_METHODS`); ``is_failure(status)``: which statuses fail (default 5xx; when
    it raises, reported once by warnings and the ``"stoic"`` logger, the default rule decides);
    ``retry_after_cap``: the longest ``Retry-After`` honoured, seconds as a float or a
    ``timedelta`` in ``[0, MAX_SECONDS]`` (default 300);
    ``runs``: ``"execute"`` for an asyncio client (:meth:`run`), ``"call"`` for a blocking one
    (:meth:`run_sync`), so that a stage of the other kind (a ``Bulkhead`` in a blocking client,
    a ``BlockingBulkhead`` in an asyncio one; a :class:`stoic.Keyed` family by the policies
    it builds) is refused here rather than failing every request (``None``: not checked).
    ``TypeError`` for a stage (a ``Retrying``, bare or in a ``Pipeline``, or a ``Hedge`` among
    them: each has its keyword), ``retry``, ``hedge``, ``retry_methods`` (a bare ``str`` included)
    or ``is_failure`` of the wrong type, or a ``retry_after_cap`` that is not a number or
    ``timedelta``; ``ValueError`` naming ``retry_after_cap`` out of range.
    """

    __slots__ = ("_held", "_shape", "hedge", "is_failure", "ok_below", "retry", "retry_after_cap",
                 "retry_methods", "stages")

    def __init__(
        self,
        stages: Sequence[Any] = (),
        *,
        retry: Retrying | None = None,
        hedge: Hedge | None = None,
        retry_methods: Collection[str] = IDEMPOTENT_METHODS,
        is_failure: Callable[[int], bool] | None = None,
        retry_after_cap: Seconds = DEFAULT_RETRY_AFTER_CAP,
        runs: str | None = None,
    ) -> None:
        for stage in stages:
            if not isinstance(stage, Keyed) and not callable(getattr(stage, "execute", None)) \
                    and not callable(getattr(stage, "call", None)):
                raise TypeError(f"a stage must be a policy or a stoic.Keyed family, got {stage!r}")
            _check_not_retry_or_hedge(stage)
            if runs is not None:
                _check_runs(stage, runs)
        if retry is not None and not isinstance(retry, Retrying):
            raise TypeError(f"retry must be a stoic.Retrying, got {type(retry).__name__}")
        if hedge is not None and not isinstance(hedge, Hedge):
            raise TypeError(f"hedge must be a stoic.Hedge, got {type(hedge).__name__}")
        if isinstance(retry_methods, str) or not all(isinstance(m, str) for m in retry_methods):
            # ("GET" is a collection of str too: its letters, which would retry nothing)
            raise TypeError(f"retry_methods must be a collection of method names, got {retry_methods!r}")
        if is_failure is not None and not callable(is_failure):
            raise TypeError(f"is_failure must be a callable (status -> bool), got {type(is_failure).__name__}")
        if is_failure is not None:
            refuse_async_callback(is_failure, "is_failure", "bool")
        cap = to_seconds(to_ns(retry_after_cap, "retry_after_cap", allow_zero=True))
        self.stages = tuple(stages)
        # The families among the stages, in order, and the shape claim() takes: 0 no family, 1 one
        # stage that is a family, 2 two stages that both are, 3 anything else.
        self._held: tuple[Keyed[Any], ...] = tuple(stage for stage in self.stages if isinstance(stage, Keyed))
        self._shape = 0 if not self._held else len(self._held) if len(self._held) == len(self.stages) <= 2 else 3
        self.retry = retry
        self.hedge = hedge
        self.retry_methods = frozenset(m.upper() for m in retry_methods)
        self.is_failure: Callable[[int], bool] = is_failure if is_failure is not None else _server_error
        # A status below this is a success that :meth:`check` would return as it is (the default
        # rule: below 429); the adapters test it before calling check, on every response.
        self.ok_below = 429 if is_failure is None else 0
        self.retry_after_cap = cap

    def claim(self, key: str) -> tuple[Sequence[Any], tuple[Any, ...] | None]:
        """The stages for ``key``, each family replaced by its key's policy with one call counted
        in flight (so the key is never dropped while a request runs through it: a breaker whose
        calls hang or fail stays to open), and the claimed slots to give back with
        :meth:`unclaim` (None when no stage is a family)."""
        shape = self._shape
        if shape == 0:
            return self.stages, None
        held = self._held
        if shape == 1:  # the common shapes, unrolled (this runs on every request): one family
            first = held[0]._claim(key)
            return (first.policy,), (first,)
        if shape == 2:  # two families
            first = held[0]._claim(key)
            try:
                second = held[1]._claim(key)
            except BaseException:
                held[0]._unclaim(key, first)
                raise
            return (first.policy, second.policy), (first, second)
        stages = list(self.stages)
        claimed: list[Any] = []
        try:
            for index, stage in enumerate(self.stages):
                if isinstance(stage, Keyed):
                    slot = stage._claim(key)
                    claimed.append(slot)
                    stages[index] = slot.policy
        except BaseException:
            self.unclaim(key, tuple(claimed))
            raise
        return stages, tuple(claimed)

    def unclaim(self, key: str, claimed: tuple[Any, ...]) -> None:
        """Give back what :meth:`claim` counted in flight (the families' slots, in stage order;
        a prefix of them when a claim failed)."""
        held = self._held
        if len(claimed) == 1:
            held[0]._unclaim(key, claimed[0])
        elif len(claimed) == 2:
            held[0]._unclaim(key, claimed[0])
            held[1]._unclaim(key, claimed[1])
        else:
            for family, slot in zip(held, claimed, strict=False):
                family._unclaim(key, slot)

    def check(self, response: Resp, status: int, headers: Any, key: str) -> Resp:
        """``response`` when it is not a failure; else raise :class:`ServerError` or
        :class:`TooManyRequests` carrying it. ``headers``: the response's headers (a
        case-insensitive mapping), whose ``Retry-After`` is read for 429 and 503 only (the
        first value when the field is repeated)."""
        if status < self.ok_below:  # a success by the default rule: no call
            return response
        if status == 429:
            raise TooManyRequests(response, label=key, retry_after=parse_retry_after(
                _retry_after(headers), cap=self.retry_after_cap))
        if self._failed(status, response):
            after = parse_retry_after(_retry_after(headers), cap=self.retry_after_cap) if status == 503 else None
            raise ServerError(status, response, after)
        return response

    def _failed(self, status: int, response: Resp) -> bool:
        try:
            return bool(plain_verdict(self.is_failure(status), "is_failure"))
        except Exception as failure:
            # A user callback never breaks a call: reported once, and the response judged by
            # the default rule (5xx) instead.
            callback_failed(self.is_failure, "is_failure", failure, ServerError(status, response))
            return _server_error(status)

    async def run(self, key: str, method: str, attempt: Callable[[], Awaitable[Resp]], made: list[Resp],
                  close: Callable[[Resp], Any], *, body_in_memory: bool = True,
                  body_replayable: bool = True, drain: Callable[[Resp], Any] | None = None) -> Resp:
        """Run ``attempt`` through the policies for ``key``; an attempt that failed by its status
        (the last one, when retries are over) is returned as a response, not raised.

        ``made``: the list ``attempt`` appends every response it receives to; ``close(response)``
        releases one (its result awaited when awaitable; a close that raises is ignored). Every
        response in ``made`` but the one returned is closed (all of them when a stage answered
        in place of the attempts), and all of them when the call raises; an awaited close runs to
        its end even when the caller is cancelled during it (then every other one is still
        closed, the one to return included, and the cancellation raised). A failed attempt that
        is to be retried has its response closed before the retry's backoff sleep (it is never
        the caller's then: the next attempt's result or error is), so no connection is held
        through the sleep; a response returned because no retry follows (attempts, budget or
        deadline exhausted) is not touched.
        ``body_in_memory``: the request has no body or its body is bytes held in memory, so two
        attempts may send it at once (the hedge applies only then). ``body_replayable``: a
        second attempt sends the body identically (False for a stream, or a file that cannot
        seek back: no retry, no hedge; see :func:`seekable`).
        ``drain(response)``: called (its result awaited when awaitable; a failure ignored) on a
        failed response before it is closed for a retry, to read what :func:`drain_first`
        allows (no body by HTTP, or one known small) so that its connection goes back to the
        pool for reuse; any other body is closed unread (its connection dropped, the pool slot
        freed). An awaited drain is cut off after :data:`DRAIN_TIMEOUT` seconds, and the
        response closed (a body cut off midway drops its connection)."""
        stages, claimed = self.claim(key)
        try:
            retry, hedge = self.retry, self.hedge
            if (retry is not None or hedge is not None) and method not in self.retry_methods \
                    and method.upper() not in self.retry_methods:  # (httpx and aiohttp give it in capitals)
                retry = hedge = None
            if not body_replayable:
                retry = hedge = None  # a second attempt would send an empty or a broken body
            elif not body_in_memory:
                hedge = None
            response: Resp
            closed = 0  # made[:closed] are closed already (failed attempts, before a retry's backoff)

            if retry is not None:  # (not built for a request that is never retried)
                async def release_failed() -> None:
                    # The retry sleeps next: every response made so far failed and will never be
                    # the caller's, and its connection may be the one another request (or the
                    # next attempt, past a bulkhead's queue) needs.
                    nonlocal closed
                    while closed < len(made):
                        failed = made[closed]
                        if drain is not None:
                            await _drained(drain, failed)
                        closed += 1
                        await _released(close, failed)

            try:
                try:
                    if hedge is None and retry is not None:
                        chain = _chain(stages, attempt)

                        async def once() -> Resp:
                            result: Resp = await chain[0](*chain[1:])
                            return result

                        response = await retry._execute_releasing(once, release_failed)
                    elif hedge is None:
                        # The stages' execute methods and the attempt as one call: the first stage
                        # gets the inner ones and the attempt as its arguments (what a Pipeline
                        # runs, without building one per request: a family's policy varies by key).
                        if len(stages) == 2:  # the common stack, called without building a tuple
                            first, second = stages
                            response = await first.execute(second.execute, attempt)
                        else:
                            chain = _chain(stages, attempt)
                            response = await chain[0](*chain[1:])
                    else:
                        async def racing(*_: Any) -> Resp:
                            # A hedge starts its attempts as tasks: it needs a coroutine function.
                            chain = _chain(stages, attempt)
                            result: Resp = await chain[0](*chain[1:])
                            return result

                        async def race() -> Resp:
                            # (A retried race: the last race's responses, all failed, were released
                            # before the backoff; within a race, a hedged attempt must not close
                            # its rivals': one may be the answer.)
                            result: Resp = await hedge.execute(IDEMPOTENT, racing)
                            return result

                        response = await (retry._execute_releasing(race, release_failed) if retry is not None
                                          else hedge.execute(IDEMPOTENT, racing))
                except (ServerError, TooManyRequests) as failed:
                    response = failed.response
            except BaseException:
                await _close_all(close, made[closed:])
                raise
            if len(made) > 1 or (made and made[0] is not response):  # (a stage may answer in place of it)
                try:
                    await _close_all(close, [made_one for made_one in made[closed:] if made_one is not response])
                except BaseException:
                    # Cancelled while closing the others: the response will never be the caller's.
                    await _close_all(close, [made_one for made_one in made[closed:] if made_one is response])
                    raise
            return response
        finally:
            if claimed is not None:
                self.unclaim(key, claimed)

    def run_sync(self, key: str, method: str, attempt: Callable[[], Resp], made: list[Resp],
                 close: Callable[[Resp], object], *, body_replayable: bool = True,
                 drain: Callable[[Resp], object] | None = None) -> Resp:
        """:meth:`run` for blocking clients: every stage needs a ``call`` method (the breaker,
        ``Retrying``, ``BlockingRateLimiter``, ``BlockingBulkhead``); a hedge is not applied;
        ``close`` and ``drain`` are called, never awaited (a blocking call cannot be cut off
        from outside: ``drain`` bounds its own reads by :data:`DRAIN_TIMEOUT`)."""
        stages, claimed = self.claim(key)
        try:
            return self._run_sync(method, attempt, made, close, stages, body_replayable, drain)
        finally:
            if claimed is not None:
                self.unclaim(key, claimed)

    def _run_sync(self, method: str, attempt: Callable[[], Resp], made: list[Resp], close: Callable[[Resp], object],
                  stages: Sequence[Any], body_replayable: bool, drain: Callable[[Resp], object] | None) -> Resp:

        closed = 0  # made[:closed] are closed already (failed attempts, before a retry's backoff)

        def through(index: int) -> Resp:
            if index == len(stages):
                return attempt()
            result: Resp = stages[index].call(through, index + 1)
            return result

        def release_failed() -> None:
            # As the asyncio run's: the retry sleeps next, and the failed responses are not the
            # caller's; their connections are given back before the sleep.
            nonlocal closed
            while closed < len(made):
                failed = made[closed]
                if drain is not None:
                    _quietly_sync(drain, failed)
                closed += 1
                _quietly_sync(close, failed)

        try:
            try:
                if self.retry is not None and body_replayable and method.upper() in self.retry_methods:
                    response = self.retry._call_releasing(partial(through, 0), release_failed)
                elif len(stages) == 1:
                    response = stages[0].call(attempt)  # the common case, called directly
                else:
                    response = through(0)
            except (ServerError, TooManyRequests) as failed:
                response = failed.response
        except BaseException:
            for made_one in made[closed:]:
                _quietly_sync(close, made_one)
            raise
        if len(made) > 1 or (made and made[0] is not response):  # (a stage may answer in place of it)
            for made_one in made[closed:]:
                if made_one is not response:
                    _quietly_sync(close, made_one)
        return response


async def _quietly(release: Callable[[Resp], Any], response: Resp) -> None:
    """``release(response)`` (a close or a drain), its result awaited when awaitable; a failure
    is ignored: the response is discarded either way, and the request's own result or error
    must stand."""
    try:
        releasing = release(response)
        if inspect.isawaitable(releasing):
            await releasing
    except Exception:
        pass


_closing: set[asyncio.Future[Any]] = set()
"""Closes under way (:func:`_released`), held until they end: one its caller stopped waiting for
(cancelled) still runs to its end, and a task the loop holds only weakly must not be collected."""


def _closed(task: asyncio.Future[Any]) -> None:
    _closing.discard(task)
    if not task.cancelled():
        task.exception()  # (retrieved: a failed close is ignored, never logged as unretrieved)


async def _released(release: Callable[[Resp], Any], response: Resp) -> None:
    """:func:`_quietly`, whose awaited part runs to its end even when the caller is cancelled
    meanwhile (the cancellation is raised at once; the close goes on by itself): a close cut
    short at an await (httpx's, closing its socket) would leave the connection checked out of
    the pool for good. Only a release that returns an awaitable costs a task."""
    try:
        releasing = release(response)
        if not inspect.isawaitable(releasing):
            return
        task = asyncio.ensure_future(releasing)
    except Exception:
        return
    _closing.add(task)
    task.add_done_callback(_closed)
    try:
        await asyncio.shield(task)
    except Exception:
        pass


async def _close_all(close: Callable[[Resp], Any], responses: Sequence[Resp]) -> None:
    """:func:`_released` for each of ``responses``, every one of them even when the caller is
    cancelled during one; the cancellation is raised once all are started."""
    cancelled: BaseException | None = None
    for response in responses:
        try:
            await _released(close, response)
        except BaseException as error:  # (a cancellation: _released lets no Exception out)
            if cancelled is None:
                cancelled = error
    if cancelled is not None:
        raise cancelled


async def _drained(drain: Callable[[Resp], Any], response: Resp) -> None:
    """``drain(response)`` as :func:`_quietly` runs it, given at most :data:`DRAIN_TIMEOUT`
    seconds: a body that stalls is left for the close that follows, which drops its connection.
    (A cancellation from outside is not the bound's: it propagates, and the run closes the
    response as it does every response of a call that raised.)"""
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT):
            await _quietly(drain, response)
    except TimeoutError:
        pass


def _quietly_sync(release: Callable[[Resp], object], response: Resp) -> None:
    """:func:`_quietly` for the blocking clients."""
    try:
        release(response)
    except Exception:
        pass


def known_small(content_length: str | None) -> bool:
    """Whether a response's ``Content-Length`` header value says its body is at most
    :data:`DRAIN_LIMIT` bytes: the bodies read (and dropped) before a retry's backoff so that
    the connection is reused. Absent or malformed: not known small (never raises)."""
    return content_length is not None and content_length.isascii() and content_length.isdigit() \
        and len(content_length) < 10 and int(content_length) <= DRAIN_LIMIT


def bodiless(method: str, status: int) -> bool:
    """Whether a response has no body by HTTP, whatever its headers say (RFC 9110 6.4.1): the
    answer to a HEAD (its ``Content-Length`` is what a GET's body would be), a 1xx, a 204 or a
    304. Reading one takes nothing from the connection; it only marks the connection reusable."""
    return status < 200 or status == 204 or status == 304 or method.upper() == "HEAD"


def drain_first(method: str, status: int, content_length: str | None) -> bool:
    """Whether a failed response released for a retry is read before it is closed, so its
    connection is reused: it has no body (:func:`bodiless`), or its body is known small
    (:func:`known_small`). Any other is closed unread."""
    return bodiless(method, status) or known_small(content_length)


def seekable(file: object) -> bool:
    """Whether a file object can seek back, so a second attempt sends its content again
    identically: its ``seekable()`` returns ``True`` (missing, raising or anything else: no).
    A multipart part or a body that is such a file is replayable; one that is not is sent once."""
    try:
        return file.seekable() is True  # type: ignore[attr-defined]
    except Exception:
        return False


def _check_not_retry_or_hedge(stage: object) -> None:
    """``TypeError`` when ``stage`` (for a :class:`stoic.Keyed` family: the policies it builds) is
    a :class:`stoic.Retrying` or a :class:`stoic.Pipeline` holding one, or a :class:`stoic.Hedge`.
    As a stage, a retry would repeat attempts inside the stages, where none of the request-level
    rules apply (idempotent methods only, bodies sent again only when replayable, failed
    responses released before the backoff): a POST would be sent again. A hedge's execute takes
    ``IDEMPOTENT`` first: it would fail every request. Each has its own keyword."""
    policy = stage._sample() if isinstance(stage, Keyed) else stage
    if retrying_in(policy) is not None:
        raise TypeError(f"a Retrying is not a stage, got {stage!r}: pass it as retry=, which repeats only "
                        "idempotent requests whose body can be sent again, releasing failed responses first")
    if isinstance(policy, Hedge):
        raise TypeError(f"a Hedge is not a stage, got {stage!r}: pass it as hedge=")


def _check_runs(stage: object, runs: str) -> None:
    """``TypeError`` when ``stage`` (for a :class:`stoic.Keyed` family: the policies it builds)
    has no ``runs`` method (``execute`` for an asyncio client, ``call`` for a blocking one)."""
    policy = stage._sample() if isinstance(stage, Keyed) else stage
    if not callable(getattr(policy, runs, None)):
        name = policy.__name__ if isinstance(policy, type) else type(policy).__name__
        client = "an asyncio client needs policies with execute()" if runs == "execute" else \
            "a blocking client needs policies with call() (CircuitBreaker, BlockingRateLimiter, BlockingBulkhead)"
        raise TypeError(f"{client}; a stage of {name} has no {runs}()")


def _chain(stages: Sequence[Policy], attempt: Callable[[], Awaitable[Resp]]) -> tuple[Any, ...]:
    """One attempt through the stages, outermost first, as ``(fn, *args)``: calling
    ``fn(*args)`` runs it (each stage's execute calls its first argument with the rest)."""
    if len(stages) == 1:  # the common case, without a comprehension's frame
        return (stages[0].execute, attempt)
    return (*[stage.execute for stage in stages], attempt)


def _retry_after(headers: Any) -> str | None:
    """A response's ``Retry-After`` value; the first one when the field came more than once (a
    proxy adding its own copy). It is a single value, not a list (RFC 9110 10.2.3), so the
    values must not be joined: httpx's ``get()`` joins repeated fields with ``", "``, which no
    parser reads (``get_list`` keeps them apart); aiohttp's ``get()`` gives the first."""
    get_list = getattr(headers, "get_list", None)
    if get_list is None:
        value: str | None = headers.get("retry-after")
        return value
    values = get_list("retry-after")
    return values[0] if values else None


def _server_error(status: int) -> bool:
    return status >= 500
