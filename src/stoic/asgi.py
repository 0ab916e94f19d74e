"""Load shedding for ASGI servers: a pure ASGI middleware (no framework; seed 003, "Queue
management" and "Criticality").

:class:`LoadShedding` admits each HTTP request through a bulkhead (a :class:`stoic.Bulkhead` or
an adaptive one: anything with ``execute``) and, first, an optional rate limiter; binds the
request's :class:`stoic.Criticality` from a header; and runs the request under the deadline a
header gives. A refusal is answered at once, before the application runs: 429 for a rate
limit, 503 for anything else (a full bulkhead, a shed request), with ``Retry-After`` (whole
seconds, rounded up) when the refusing policy knows when to come back; 504 when the request's
deadline passes before the application answered. Lifespan and websocket scopes pass through.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from ._criticality import Criticality, bind_criticality
from ._deadline import timeout
from ._durations import MAX_SECONDS
from ._errors import DeadlineExceeded, RateLimited, Rejected, is_rejection, leaves
from ._policy import is_async_callable, not_a_policy

__all__ = ["LoadShedding", "parse_criticality"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_TIERS: Final = {c.name.lower(): c for c in Criticality} | {c.name.lower().replace("_", "-"): c for c in Criticality}


def parse_criticality(value: bytes | str | None) -> Criticality:
    """A header value as a tier, by name (``critical``, ``normal``, ``degraded``, ``best_effort``
    or ``best-effort``, any case); anything else, or no header, is ``Criticality.NORMAL``."""
    if value is None:
        return Criticality.NORMAL
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return _TIERS.get(text.strip().lower(), Criticality.NORMAL)


def _seconds(value: bytes) -> float | None:
    """A deadline header's seconds; ``None`` (no deadline) when unparsable, NaN, or longer than
    any deadline stoic holds (``MAX_SECONDS``, infinity included: ``stoic.timeout`` would refuse
    it, and the request, whatever a client sends, must not fail on it). Minus infinity is kept:
    a deadline passed already, like any other value of 0 or less."""
    try:
        seconds = float(value.decode("latin-1").strip())
    except ValueError:
        return None
    return seconds if seconds <= MAX_SECONDS else None  # (False for NaN)


def _runs_twice(admission: object) -> str | None:
    """Why ``admission`` would run the application more than once per request, or None: a
    :class:`stoic.Retrying`, bare or a stage of a :class:`stoic.Pipeline`. The application reads
    the request's body and may have answered before it fails; run again, it would start a second
    response on the same request."""
    from .pipeline import retrying_in  # (construction only: the middleware needs none of it)

    if (stage := retrying_in(admission)) is None:
        return None
    return (f"a Retrying would run the application again after a failure, on a request whose body it "
            f"has read and which it may have answered, got {stage!r}: retry in the client, or let the "
            "bulkhead queue (queue_limit)")


class LoadShedding:
    """``app = LoadShedding(app, bulkhead=Bulkhead(64, queue_limit=0, label="ingress"))``.

    - ``bulkhead``: admits requests (anything with ``execute``: :class:`stoic.Bulkhead`, an
      adaptive bulkhead, a :class:`stoic.Pipeline`); required.
    - ``limiter``: an optional :class:`stoic.RateLimiter` asked first (one permit a request;
      its ``queue_limit`` decides whether a request may wait for one).
    - ``criticality_header`` (default ``"x-criticality"``; ``None`` to ignore): the request's
      tier, bound with :func:`stoic.bind_criticality` for the bulkhead and the application.
    - ``deadline_header`` (default ``None``): a header giving the seconds the caller will wait
      (for example ``"x-request-timeout"``); the request runs under ``stoic.timeout`` of it
      (unparsable, or over ``MAX_SECONDS``: ignored; 0 or less, minus infinity included: 504 at once).

    Raises ``TypeError`` when ``bulkhead`` has no ``execute`` (or is a :class:`stoic.Hedge` or a
    :class:`stoic.Keyed` family, whose ``execute`` takes something else first, or is or holds a
    :class:`stoic.Retrying`, which would run the application twice), ``limiter`` has
    no async ``acquire`` (a :class:`stoic.BlockingRateLimiter` would block the event loop), or
    a header name is not a ``str``; ``ValueError`` naming the parameter for an empty or
    non-ASCII header name (it could never match a request's header).
    """

    __slots__ = ("_app", "_bulkhead", "_criticality", "_deadline", "_limiter")

    def __init__(
        self,
        app: ASGIApp,
        *,
        bulkhead: Any,
        limiter: Any = None,
        criticality_header: str | None = "x-criticality",
        deadline_header: str | None = None,
    ) -> None:
        if not callable(getattr(bulkhead, "execute", None)):
            raise TypeError(f"bulkhead must be a policy with execute(), got {type(bulkhead).__name__}")
        if (why := not_a_policy(bulkhead, "hedge inside the application, per call, not around it")) is not None:
            raise TypeError(f"bulkhead: {why}")
        if (why := _runs_twice(bulkhead)) is not None:
            raise TypeError(f"bulkhead: {why}")
        if limiter is not None and not is_async_callable(getattr(limiter, "acquire", None)):
            # (a BlockingRateLimiter's acquire would block the event loop, then fail every request)
            raise TypeError(f"limiter must be a stoic.RateLimiter (with an async acquire()), "
                            f"got {type(limiter).__name__}")
        for name, header in (("criticality_header", criticality_header), ("deadline_header", deadline_header)):
            if header is not None and not isinstance(header, str):
                raise TypeError(f"{name} must be a str (a header name) or None, got {type(header).__name__}")
            if header is not None and (not header or not header.isascii()):
                raise ValueError(f"{name} must be a non-empty ASCII header name, got {header!r}")
        self._app = app
        self._bulkhead = bulkhead
        self._limiter = limiter
        self._criticality = None if criticality_header is None else criticality_header.lower().encode("latin-1")
        self._deadline = None if deadline_header is None else deadline_header.lower().encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        tier_value: bytes | None = None
        deadline_value: bytes | None = None
        for name, value in scope.get("headers", ()):
            if name == self._criticality:
                tier_value = value
            elif name == self._deadline:
                deadline_value = value
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        async def run() -> None:
            await self._app(scope, receive, tracking_send)

        async def admit() -> None:
            if self._limiter is not None:
                await self._limiter.acquire()
            await self._bulkhead.execute(run)

        seconds = _seconds(deadline_value) if deadline_value is not None else None
        try:
            with bind_criticality(parse_criticality(tier_value)):
                if seconds is None:
                    await admit()
                elif seconds <= 0:
                    raise DeadlineExceeded("the request's deadline had passed on arrival")
                else:
                    async with timeout(seconds):
                        await admit()
        except Rejected as refused:
            if started:
                raise  # the application had answered already: nothing to add
            await _refuse(send, [refused])
        except BaseExceptionGroup as group:
            # An application fanning out (a TaskGroup) whose every branch was refused: a refusal,
            # by the exception-group rule (docs/design.md); a group with anything else in it is
            # the application's error.
            if started or not is_rejection(group):
                raise
            await _refuse(send, [leaf for leaf in leaves(group) if isinstance(leaf, Rejected)])


async def _refuse(send: Send, refusals: list[Rejected]) -> None:
    """Answer for ``refusals`` (one refusal, or every leaf of a group of them): 504 when all are
    deadlines, 429 when all are rate limits, else 503; ``Retry-After`` the longest any asks."""
    if all(isinstance(refused, DeadlineExceeded) for refused in refusals):
        status, text = 504, b"deadline exceeded"
    elif all(isinstance(refused, RateLimited) for refused in refusals):
        status, text = 429, b"rate limited"
    else:
        status, text = 503, b"overloaded"
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(text)).encode())]
    waits = [refused.retry_after for refused in refusals if not isinstance(refused, DeadlineExceeded)]
    after = max((wait for wait in waits if wait is not None and math.isfinite(wait) and wait >= 0), default=None)
    if after is not None and status != 504:
        headers.append((b"retry-after", str(math.ceil(after)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text})
