"""aiohttp client middleware running every request through stoic policies
(``pip install stoic[aiohttp]``; aiohttp 3.12+: ``ClientSession(middlewares=[...])``).

The rules are :mod:`stoic.httpx`'s (both adapters call :class:`stoic._http.HTTPPolicies`): a 5xx
response, a connection error and a timeout are failures; a 429 is the server's refusal
(:class:`TooManyRequests`, ignored by the breaker); ``Retry-After`` on a 429 or 503 replaces the
retry schedule's delay (clamped to ``[0, retry_after_cap]``; malformed: ignored); only
idempotent methods are retried or hedged unless ``retry_methods`` says otherwise; every failed
attempt's response is released, and the last one is returned when no retry is left.

A hedge sends the same ``ClientRequest`` again while the first attempt is still waiting; it
applies only to a request with no body or an in-memory one (bytes, str, JSON, url-encoded form:
aiohttp's ``BytesPayload``), since two attempts would read one file or stream at once. The
losing attempts are cancelled (aiohttp closes their connections) and a losing response that
had already arrived is released.

A request is retried only when a second attempt sends its body identically: none, one in
memory (a ``BytesPayload``), a file that can seek back (aiohttp seeks it to where the first
attempt started), or a multipart body (``FormData`` with files, ``MultipartWriter``, nested
ones) made only of those. Any other body is sent once, not retried: an async iterable or a
``StreamReader``, a file that cannot seek (a pipe), a multipart body with such a part, a
payload aiohttp already marks ``consumed``, and any ``Payload`` class this module does not know.
A failed response whose request is retried is released before the retry's backoff sleep, read
first when it has no body by HTTP (to a HEAD; a 1xx, 204 or 304) or its ``Content-Length`` is
at most 64 KiB (so the connection is reused; for at most 0.1 s, after which it is closed), else
closed unread; the one returned when no retry follows is untouched.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any, Final

try:
    from aiohttp import ClientRequest, ClientResponse
    from aiohttp.client_middlewares import ClientHandlerType
    from aiohttp.multipart import MultipartWriter
    from aiohttp.payload import BytesPayload, IOBasePayload
except ImportError as exc:  # the optional extra is missing (or older than 3.12): say which one
    raise ImportError("stoic.aiohttp needs aiohttp 3.12 or later: pip install 'stoic[aiohttp]'") from exc

from ._durations import Seconds
from ._http import (
    DEFAULT_RETRY_AFTER_CAP,
    IDEMPOTENT_METHODS,
    HTTPPolicies,
    ServerError,
    TooManyRequests,
    drain_first,
    seekable,
)
from .hedge import Hedge
from .pipeline import Retrying

__all__ = ["IDEMPOTENT_METHODS", "ResilientMiddleware", "ServerError", "TooManyRequests", "by_host", "by_route"]

_release = operator.methodcaller("release")  # (a method call: a session may use its own response class)
KeyFunction = Callable[[ClientRequest], str]


def _replayable(body: object) -> bool:
    """Whether a second attempt sends the request body identically (see the module docstring):
    aiohttp's own classes only, since a payload of another kind may read its source once."""
    if isinstance(body, (bytes, BytesPayload)):  # (b"": no body)
        return True
    if isinstance(body, IOBasePayload):
        # aiohttp seeks a file back to where its first write started; one that cannot seek it
        # marks consumed (after that write) and would send from where the first one stopped.
        # (The file is the payload's _value: aiohttp has no public accessor; absent, not seekable.)
        return not body.consumed and seekable(getattr(body, "_value", None))
    if isinstance(body, MultipartWriter):
        return not body.consumed and all(_replayable(part) for part, _encoding, _te in body)
    return False


async def _drain(response: ClientResponse) -> None:
    """Read a failed response (dropped) before it is released for a retry's backoff, when
    :func:`stoic._http.drain_first` says so: its connection goes back to the pool instead of
    being closed. (The policies cut it off after ``DRAIN_TIMEOUT``; a body left unread then
    makes aiohttp close the connection on release.)"""
    if drain_first(response.method, response.status, response.headers.get("content-length")):
        async for _ in response.content.iter_chunked(64 * 1024):
            pass


_DEFAULT_PORTS: Final = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def by_host(request: ClientRequest) -> str:
    """The request's ``host[:port]``, as :func:`stoic.httpx.by_host` gives it (httpx's
    ``netloc``): lowercase, IDNA-encoded, an IPv6 literal bracketed, the port only when the URL
    gives one that is not the scheme's default (``http://h:80/`` is ``h``, one dependency)."""
    url = request.url
    host = url.raw_host or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal ("::1:8080" would be ambiguous)
    port = url.explicit_port
    return host if port is None or port == _DEFAULT_PORTS.get(url.scheme) else f"{host}:{port}"


def by_route(*templates: str) -> KeyFunction:
    """``"host[:port] METHOD template"`` for the first matching template (``{name}`` matches one
    segment), else ``"host[:port] METHOD *"`` (see :func:`stoic.httpx.by_route`)."""
    compiled = [(t, re.compile("^" + re.sub(r"\\\{[^/{}]+\\\}", "[^/]+", re.escape(t)) + "/?$")) for t in templates]

    def key(request: ClientRequest) -> str:
        path = request.url.path
        for template, pattern in compiled:
            if pattern.match(path):
                return f"{by_host(request)} {request.method} {template}"
        return f"{by_host(request)} {request.method} *"

    return key


class ResilientMiddleware:
    """``aiohttp.ClientSession(middlewares=[ResilientMiddleware(stages=[breakers], retry=...)])``.

    ``stages``: policies or :class:`stoic.Keyed` families, outermost first; ``retry`` (a
    :class:`stoic.Retrying`) and ``hedge`` (a :class:`stoic.Hedge`; see the module docstring
    for which bodies it sends twice) apply to ``retry_methods`` only (default: the idempotent
    ones); ``key``: request -> key (default :func:`by_host`); ``is_failure``: status -> bool
    (default: 5xx); ``retry_after_cap``: seconds as a float or ``timedelta`` (default 300).
    Raises ``TypeError`` for a stage that is not a policy or family (or one for blocking
    clients only, such as a ``BlockingBulkhead``), a ``retry`` that is not a ``Retrying``, a
    ``hedge`` that is not a ``Hedge`` or a ``retry_after_cap`` that is not a number or
    ``timedelta``; ``ValueError`` naming ``retry_after_cap`` outside ``[0, MAX_SECONDS]``.
    """

    __slots__ = ("_key", "_policies")

    def __init__(
        self,
        *,
        stages: Sequence[Any] = (),
        retry: Retrying | None = None,
        hedge: Hedge | None = None,
        key: KeyFunction = by_host,
        retry_methods: Collection[str] = IDEMPOTENT_METHODS,
        is_failure: Callable[[int], bool] | None = None,
        retry_after_cap: Seconds = DEFAULT_RETRY_AFTER_CAP,
    ) -> None:
        self._policies: HTTPPolicies[ClientResponse] = HTTPPolicies(
            stages, retry=retry, hedge=hedge, retry_methods=retry_methods, is_failure=is_failure,
            retry_after_cap=retry_after_cap, runs="execute")
        self._key = key

    def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> Coroutine[Any, Any, ClientResponse]:
        """The response to ``request`` after the policies (a plain method returning the
        policies' coroutine, awaited by aiohttp: no coroutine of its own per request)."""
        key = self._key(request)
        policies = self._policies
        ok_below = policies.ok_below
        made: list[ClientResponse] = []

        async def attempt() -> ClientResponse:
            response = await handler(request)
            made.append(response)
            status = response.status
            if status < ok_below:  # a success by the default rule: no call to check
                return response
            return policies.check(response, status, response.headers, key)

        body = request.body
        return policies.run(key, request.method, attempt, made, _release,
                            body_in_memory=policies.hedge is None or isinstance(body, (bytes, BytesPayload)),
                            body_replayable=policies.retry is None or _replayable(body), drain=_drain)
