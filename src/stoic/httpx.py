"""httpx transports that run every request through stoic policies (``pip install stoic[httpx]``).

``ResilientTransport`` (for ``httpx.Client``) and ``AsyncResilientTransport`` (for
``httpx.AsyncClient``) wrap another transport (default: httpx's own) and send each request
through :class:`stoic._http.HTTPPolicies`: retry and hedge for idempotent methods, then the
stages (breaker, limiter, bulkhead; each a policy or a :class:`stoic.Keyed` family resolved by
the request's key: the host by default, or a route template with :func:`by_route`).

What counts: a 5xx response, a connection error and a timeout (httpx's ``TransportError``) are
failures; a 429 is the server's refusal (:class:`TooManyRequests`, ignored by the breaker);
``Retry-After`` on a 429 or 503 (seconds or an HTTP date, clamped to ``[0, retry_after_cap]``;
malformed: ignored) replaces the retry schedule's delay. A response that failed by its status
is still a response: the caller gets the last one when no retry is left, untouched (readable).
A failed response whose request is retried is released before the retry's backoff sleep: one
with no body by HTTP (to a HEAD; a 1xx, 204 or 304), or a body of at most 64 KiB by its
``Content-Length``, is read first so the connection is reused (for at most 0.1 s: a body not
in by then is closed, its connection dropped), any other is closed unread, so a retry sleeping
out a ``Retry-After`` holds no connection of the pool. A hedge applies only to a request whose
body is in memory (none, bytes, JSON, a url-encoded form): two attempts cannot read one stream
or file at once. A request is retried only when a second attempt sends its body identically:
in memory, or a multipart form whose files are bytes or can seek back (httpx renders the form
again, each file from its start). Any other body (a generator, an async iterator, a file as
``content=``, a form file that cannot seek) is sent once: not retried, the first answer is the
caller's. A refusal by a policy (``CircuitOpen``, ``RateLimited``, ``BulkheadFull``) is raised
as itself. The stages hold an attempt up to its response headers (the breaker times that much,
a bulkhead's slot is given back then); the caller reads the body afterwards, outside them.
"""

from __future__ import annotations

import operator
import re
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any

try:
    import httpx
except ImportError as exc:  # the optional extra is missing: say which one
    raise ImportError("stoic.httpx needs httpx: pip install 'stoic[httpx]'") from exc

from . import _http
from ._durations import Seconds
from ._http import (
    DEFAULT_RETRY_AFTER_CAP,
    IDEMPOTENT_METHODS,
    HTTPPolicies,
    ServerError,
    TooManyRequests,
    drain_first,
    parse_retry_after,
    seekable,
)
from .hedge import Hedge
from .pipeline import Retrying

__all__ = [
    "IDEMPOTENT_METHODS",
    "AsyncResilientTransport",
    "ResilientTransport",
    "ServerError",
    "TooManyRequests",
    "by_host",
    "by_route",
    "parse_retry_after",
]

_aclose = operator.methodcaller("aclose")  # (a method call: an inner transport may return a Response subclass)
_close = operator.methodcaller("close")
try:
    from httpx._multipart import FileField, MultipartStream
except ImportError:  # pragma: no cover - a later httpx that moved them: every multipart form is sent once
    FileField = MultipartStream = None  # type: ignore[assignment,misc]
KeyFunction = Callable[[httpx.Request], str]


def _replayable(stream: object) -> bool:
    """Whether a second attempt sends the request body ``stream`` identically (see
    :mod:`stoic._http`): bytes in memory (``content=`` bytes or str, ``json=``, a url-encoded
    ``data=`` form, no body), or a multipart form whose every file is bytes, a str or a file
    that can seek back (httpx renders the form afresh, seeking each file to its start). A
    generator, an async iterator or a file given as ``content=`` is read once; so is a form file
    that cannot seek (httpx would send it empty the second time)."""
    kind = type(stream)
    if kind is httpx.ByteStream:
        return True
    if kind is not MultipartStream:  # (None when httpx moved it: never a stream's type)
        return False
    return all(not isinstance(field, FileField) or isinstance(field.file, (bytes, str)) or seekable(field.file)
               for field in stream.fields)  # type: ignore[attr-defined]


def _request_of(response: httpx.Response) -> httpx.Request | None:
    """The request a response answered: set by the attempt on every response it raises for
    (a transport's response has none until the client sets it). ``None`` for a response some
    stage failed after the attempt returned it (the drain then goes by its length alone)."""
    try:
        return response.request
    except RuntimeError:
        return None


def _drains(response: httpx.Response, request: httpx.Request | None) -> bool:
    """:func:`stoic._http.drain_first` for ``response`` (the answer to ``request``, if known)."""
    return drain_first("" if request is None else request.method, response.status_code,
                       response.headers.get("content-length"))


async def _drain_async(response: httpx.Response) -> None:
    """Read a failed response (raw, dropped) before it is closed for a retry's backoff, when
    :func:`stoic._http.drain_first` says so: its connection goes back to the pool instead of
    being dropped. (The policies cut it off after ``DRAIN_TIMEOUT``.)"""
    if _drains(response, _request_of(response)):
        async for _ in response.aiter_raw():
            pass


def _drain(response: httpx.Response) -> None:
    """:func:`_drain_async` for the blocking transport, which bounds its own time: each read
    waits at most ``DRAIN_TIMEOUT`` (httpx's read timeout for the request, lowered for the drain
    and put back after it, so a next attempt has the client's own), and no read starts once
    that time is up. Either way the rest is left for the close, which drops the connection."""
    request = _request_of(response)
    if not _drains(response, request):
        return
    bound = _http.DRAIN_TIMEOUT
    extensions: dict[str, Any] = {} if request is None else request.extensions
    timeouts = extensions.get("timeout")
    read = timeouts.get("read") if isinstance(timeouts, dict) else None
    extensions["timeout"] = {**(timeouts if isinstance(timeouts, dict) else {}),
                             "read": bound if read is None else min(read, bound)}
    try:
        ends = time.monotonic() + bound
        for _ in response.iter_raw():
            if time.monotonic() >= ends:
                break
    finally:
        if timeouts is None:
            del extensions["timeout"]
        else:
            extensions["timeout"] = timeouts


def by_host(request: httpx.Request) -> str:
    """The request's ``host[:port]`` (the default key: one policy per dependency): httpx's
    ``url.netloc``, lowercase, IDNA-encoded, the port only when not the scheme's default."""
    url = request.url
    host = url.host
    if host.isascii() and ":" not in host:
        # What netloc would say, without its str -> bytes -> str round trip (an IPv6 literal
        # is bracketed there and an IDNA name encoded: both take the general path).
        port = url.port
        return host if port is None else f"{host}:{port}"
    return url.netloc.decode("ascii", "replace")


def by_route(*templates: str) -> KeyFunction:
    """A key function: ``"host[:port] METHOD template"`` for the first template matching the
    path (``"/users/{id}"``: a ``{name}`` matches one path segment), else ``"host[:port] METHOD *"``,
    so the number of keys is bounded by hosts x methods x templates, whatever the paths hold."""
    compiled = [(t, re.compile("^" + re.sub(r"\\\{[^/{}]+\\\}", "[^/]+", re.escape(t)) + "/?$")) for t in templates]

    def key(request: httpx.Request) -> str:
        path = request.url.path
        for template, pattern in compiled:
            if pattern.match(path):
                return f"{by_host(request)} {request.method} {template}"
        return f"{by_host(request)} {request.method} *"

    return key


def _policies(stages: Sequence[Any], retry: Retrying | None, hedge: Hedge | None, retry_methods: Collection[str],
              is_failure: Callable[[int], bool] | None, retry_after_cap: Seconds,
              runs: str) -> HTTPPolicies[httpx.Response]:
    return HTTPPolicies(stages, retry=retry, hedge=hedge, retry_methods=retry_methods, is_failure=is_failure,
                        retry_after_cap=retry_after_cap, runs=runs)


class AsyncResilientTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(transport=AsyncResilientTransport(stages=[breakers], retry=...))``.

    ``transport``: the transport that sends (default ``httpx.AsyncHTTPTransport()``; closed
    with this one). ``stages``: policies or :class:`stoic.Keyed` families, outermost first.
    ``retry`` (:class:`stoic.Retrying`) and ``hedge`` (:class:`stoic.Hedge`) apply to
    ``retry_methods`` only (default: the idempotent ones). ``key``: request -> key (default
    :func:`by_host`). ``is_failure``: status -> bool (default: 5xx). ``retry_after_cap``:
    seconds as a float or ``timedelta`` (default 300). Raises ``TypeError`` for a stage that
    is not a policy or family, or one for blocking clients only (``BlockingBulkhead``,
    ``BlockingRateLimiter``), or a ``retry_after_cap`` that is not a number or ``timedelta``;
    ``ValueError`` naming ``retry_after_cap`` outside ``[0, MAX_SECONDS]``.
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        stages: Sequence[Any] = (),
        retry: Retrying | None = None,
        hedge: Hedge | None = None,
        key: KeyFunction = by_host,
        retry_methods: Collection[str] = IDEMPOTENT_METHODS,
        is_failure: Callable[[int], bool] | None = None,
        retry_after_cap: Seconds = DEFAULT_RETRY_AFTER_CAP,
    ) -> None:
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()
        self._policies = _policies(stages, retry, hedge, retry_methods, is_failure, retry_after_cap, "execute")
        self._key = key

    def handle_async_request(self, request: httpx.Request) -> Coroutine[Any, Any, httpx.Response]:
        """The response to ``request`` after the policies (a plain method returning the
        policies' coroutine, awaited by httpx: no coroutine of its own per request)."""
        key = self._key(request)
        policies, inner = self._policies, self._inner
        ok_below = policies.ok_below
        made: list[httpx.Response] = []

        async def attempt() -> httpx.Response:
            response = await inner.handle_async_request(request)
            made.append(response)
            status = response.status_code
            if status < ok_below:  # a success by the default rule: no call to check
                return response
            try:
                return policies.check(response, status, response.headers, key)
            except BaseException:
                response.request = request  # (what a drain before the retry's backoff reads)
                raise

        stream = request.stream
        return policies.run(key, request.method, attempt, made, _aclose,
                            body_in_memory=policies.hedge is None or type(stream) is httpx.ByteStream,
                            body_replayable=policies.retry is None or _replayable(stream),
                            drain=_drain_async)

    async def aclose(self) -> None:
        await self._inner.aclose()


class ResilientTransport(httpx.BaseTransport):
    """``httpx.Client(transport=ResilientTransport(stages=[breakers], retry=...))``: the same
    rules as :class:`AsyncResilientTransport` for blocking clients. Every stage needs a ``call``
    method (``CircuitBreaker``, ``BlockingRateLimiter``, ``BlockingBulkhead``, a
    :class:`stoic.Keyed` family of them; ``TypeError`` for one without, such as an asyncio
    ``Bulkhead``); there is no hedge (``TypeError`` if one is given; ``hedge=None`` is
    accepted, so one set of keyword arguments builds either transport)."""

    def __init__(
        self,
        transport: httpx.BaseTransport | None = None,
        *,
        stages: Sequence[Any] = (),
        retry: Retrying | None = None,
        key: KeyFunction = by_host,
        retry_methods: Collection[str] = IDEMPOTENT_METHODS,
        is_failure: Callable[[int], bool] | None = None,
        retry_after_cap: Seconds = DEFAULT_RETRY_AFTER_CAP,
        **unexpected: Any,
    ) -> None:
        # hedge=None is accepted, so that one set of keyword arguments can build either transport.
        if unexpected.pop("hedge", None) is not None:
            raise TypeError("hedging is asynchronous only: use AsyncResilientTransport")
        if unexpected:
            raise TypeError(f"unexpected keyword argument(s) {sorted(unexpected)}")
        self._inner = transport if transport is not None else httpx.HTTPTransport()
        self._policies = _policies(stages, retry, None, retry_methods, is_failure, retry_after_cap, "call")
        self._key = key

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = self._key(request)
        policies, inner = self._policies, self._inner
        ok_below = policies.ok_below
        made: list[httpx.Response] = []

        def attempt() -> httpx.Response:
            response = inner.handle_request(request)
            made.append(response)
            status = response.status_code
            if status < ok_below:  # a success by the default rule: no call to check
                return response
            try:
                return policies.check(response, status, response.headers, key)
            except BaseException:
                response.request = request  # (what a drain before the retry's backoff reads)
                raise

        return policies.run_sync(key, request.method, attempt, made, _close,
                                 body_replayable=policies.retry is None or _replayable(request.stream),
                                 drain=_drain)

    def close(self) -> None:
        self._inner.close()
