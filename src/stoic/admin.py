"""The admin endpoint: a :class:`stoic.ControlPlane` served as JSON by a pure ASGI app (seed 003,
"Control plane"; no framework dependency).

Routes (``prefix`` + ...):

- ``GET /policies``: every ``(policy, key)`` snapshot; ``GET /policies/{name}``: one policy's
  (``HEAD`` on either: the same status and headers, no content).
- ``POST /policies/{name}/force-open`` and ``POST /policies/{name}/clear``, body
  ``{"key": str | null, "actor": str}`` (both optional; no key = every key).
- ``POST /policies/{name}/retune``, body ``{"changes": {parameter: value, ...}, "actor": str}``;
  values are JSON numbers, booleans, strings or null.

Answers: 200 with JSON; 400 with ``{"error": message}`` for malformed JSON, an unknown field, a
value of the wrong shape or one the policy's constructor refuses (its ``ValueError`` /
``TypeError`` text, which names the parameter and the range and echoes only what the caller
sent); 401 without the right token; 403 without a token configured on a non-loopback address;
404 for an unknown route, policy or key (a POST to ``/policies/{name}/{action}`` with an action
it does not know, naming the actions); 405 for a wrong method on a route that exists (with
``Allow``); 413 for a body over 64 KiB; 500 ``{"error": "internal error"}`` for anything else.
Exception messages other than those validation messages, and configuration, are never sent.

Security: with a ``token``, every request needs ``Authorization: Bearer <token>``, compared in
constant time (:func:`hmac.compare_digest`). Without one the app answers only requests that
reached it on a loopback address, and :func:`serve_admin` refuses to bind anywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from .control import ControlPlane, UnknownPolicy

__all__ = ["admin_app", "is_loopback", "serve_admin"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_MAX_BODY: Final = 64 * 1024
_ACTIONS: Final = ("force-open", "clear", "retune")
_READ: Final = ("GET", "HEAD")  # HEAD answers as GET, without the content (RFC 9110 9.3.2)
_FIELDS: Final = {"force-open": {"key", "actor"}, "clear": {"key", "actor"}, "retune": {"changes", "actor"}}


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is a loopback address (``127.0.0.0/8``, ``::1``) or ``localhost``."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _Gone(Exception):
    """The client disconnected before its body arrived: nobody to answer."""


class _Refused(Exception):
    def __init__(self, status: int, message: str, allow: bytes | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.allow = allow  # a 405's Allow header (RFC 9110 15.5.6)


def _use_get() -> _Refused:
    return _Refused(405, "use GET", b"GET, HEAD")


def admin_app(control: ControlPlane, *, token: str | None = None, prefix: str = "") -> ASGIApp:
    """The ASGI app serving ``control`` (see the module docstring for routes and answers).

    ``token``: the bearer token every request must carry (``None``: loopback only; an empty
    string is a ``ValueError``, another type a ``TypeError``). ``prefix``: a path prefix such as
    ``"/admin"`` (``ValueError`` unless empty or starting with ``/``). Raises ``TypeError`` when
    ``control`` is not a :class:`stoic.ControlPlane`.
    """
    if not isinstance(control, ControlPlane):
        raise TypeError(f"control must be a stoic.ControlPlane, got {type(control).__name__}")
    if token is not None and not isinstance(token, str):
        raise TypeError(f"token must be a str (or None for loopback only), got {type(token).__name__}")
    if token is not None and not token:
        raise ValueError("token must be a non-empty str (or None for loopback only)")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if prefix and not prefix.startswith("/"):
        # A request path always starts with "/": this prefix would match nothing, silently.
        raise ValueError(f"prefix must be empty or start with '/', got {prefix!r}")
    expected = None if token is None else token.encode()
    root = prefix.rstrip("/") + "/policies"

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not served: closing without accepting refuses them
        allow = None
        try:
            _authorise(scope, expected)
            status, body = await _route(control, root, scope, receive)
        except _Gone:
            return
        except _Refused as refused:
            status, body, allow = refused.status, {"error": refused.message}, refused.allow
        except Exception:
            status, body = 500, {"error": "internal error"}
        await _respond(send, status, body, allow=allow, head=scope["method"] == "HEAD")

    return app


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _authorise(scope: Scope, expected: bytes | None) -> None:
    if expected is None:
        server = scope.get("server")
        if not is_loopback(server[0] if server else None):
            raise _Refused(403, "this endpoint has no token: it answers on a loopback address only")
        return
    given = b""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            given = bytes(value)
            break
    # "Bearer <token>"; the scheme is case-insensitive (RFC 9110 11.1: "bearer" is as good).
    scheme, _, credentials = given.strip().partition(b" ")
    if not hmac.compare_digest(credentials.strip(b" "), expected) or scheme.lower() != b"bearer":
        raise _Refused(401, "a valid bearer token is required")


async def _route(control: ControlPlane, root: str, scope: Scope, receive: Receive) -> tuple[int, Any]:
    path: str = scope["path"]
    method: str = scope["method"]
    if path == root or path == root + "/":
        if method not in _READ:
            raise _use_get()
        return 200, {"policies": _inspect(control)}
    if not path.startswith(root + "/"):
        raise _Refused(404, "not found")
    rest = path[len(root) + 1:]
    name, _, action = rest.rpartition("/")
    if action in _ACTIONS and name:
        if method != "POST":
            raise _Refused(405, "use POST", b"POST")
        body = await _read_json(receive)
        return 200, _act(control, name, action, body)
    if method not in _READ:
        try:
            control.get(rest)
        except UnknownPolicy:
            # Nothing is registered here for a GET to find either: most likely a mistyped action
            # (force_open for force-open), which "use GET" would send the wrong way.
            raise _Refused(404, f"no policy named {rest!r}, nor an action {action!r} "
                                f"(POST to a policy's {', '.join(_ACTIONS)})") from None
        raise _use_get()
    try:
        return 200, {"policies": _inspect(control, rest)}
    except UnknownPolicy:
        raise _Refused(404, f"no policy named {rest!r}") from None


def _inspect(control: ControlPlane, name: str | None = None) -> list[dict[str, Any]]:
    """The snapshots of ``name`` (every policy's for ``None``), read in an empty context: a read
    applies due lazy transitions (a breaker's open period over), whose events belong to no
    request, not to this one (its span, its scoped sinks); the process-wide sinks get them.
    ``UnknownPolicy`` for a name not registered."""
    return [s.as_dict() for s in contextvars.Context().run(control.inspect, name)]


async def _read_json(receive: Receive) -> dict[str, Any]:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            raise _Refused(413, f"the body is over {_MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # (nesting too deep for the parser)
        raise _Refused(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _Refused(400, "the body must be a JSON object")
    return body


def _act(control: ControlPlane, name: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
    unknown = set(body) - _FIELDS[action]
    if unknown:
        raise _Refused(400, f"unknown field(s) {sorted(unknown)}; {action} takes {sorted(_FIELDS[action])}")
    actor = body.get("actor")
    if actor is not None and (not isinstance(actor, str) or len(actor) > 200):
        raise _Refused(400, "actor must be a string of at most 200 characters")
    try:
        if action == "retune":
            changes = body.get("changes")
            if not isinstance(changes, dict) or not changes:
                raise _Refused(400, "changes must be a non-empty object of parameter: value")
            if "actor" in changes:
                # (ControlPlane.retune's own keyword: passed on, Python's call error would answer.)
                raise _Refused(400, "changes: 'actor' is not a parameter of a policy (give it beside changes)")
            for key, value in changes.items():
                if isinstance(value, (dict, list)):
                    raise _Refused(400, f"{key}: only numbers, booleans, strings and null can be set here")
            count = control.retune(name, actor=actor, **changes)
            return {"policy": name, "retuned": count, "parameters": sorted(changes)}
        key = body.get("key")
        if key is not None and not isinstance(key, str):
            raise _Refused(400, "key must be a string or null")
        if action == "force-open":
            return {"policy": name, "key": key, "forced_open": control.force_open(name, key, actor=actor)}
        return {"policy": name, "key": key, "cleared": control.clear_forced_open(name, key, actor=actor)}
    except UnknownPolicy as exc:
        raise _Refused(404, str(exc)) from None
    except (ValueError, TypeError) as exc:
        # Validation messages name the parameter and its range, and echo only the caller's input.
        raise _Refused(400, str(exc)) from None


async def _respond(send: Send, status: int, body: Any, *, allow: bytes | None, head: bool) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
               (b"cache-control", b"no-store")]
    if allow is not None:
        headers.append((b"allow", allow))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    # HEAD: GET's status and headers (its content-length included), without the content.
    await send({"type": "http.response.body", "body": b"" if head else data})


async def serve_admin(control: ControlPlane, *, host: str = "127.0.0.1", port: int = 0,
                      token: str | None = None, prefix: str = "",
                      started: Callable[[int], None] | None = None) -> None:
    """Serve :func:`admin_app` with uvicorn (``pip install uvicorn``) until cancelled.

    Raises ``ValueError`` before binding when ``host`` is not a loopback address and no
    ``token`` is given; the ``OSError`` when it cannot listen there (the port taken: never
    uvicorn's ``SystemExit``, which would stop the application's event loop). ``port`` 0 takes
    a free one; ``started(port)`` is called once listening.
    """
    if token is None and not is_loopback(host):
        raise ValueError(f"host {host!r} is not a loopback address: the admin endpoint needs a token there")
    import uvicorn  # an optional dependency, imported only here

    class _Server(uvicorn.Server):
        def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
            return contextlib.nullcontext()  # the application owns its signals, not this endpoint

    app = admin_app(control, token=token, prefix=prefix)
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                    access_log=False))

    async def serving() -> None:
        # uvicorn answers a failed start (the port taken, the address not this host's) with
        # sys.exit(); a SystemExit out of a task stops the whole event loop, the application's
        # with it. It is raised here as the error it stands for instead.
        try:
            await server.serve()
        except SystemExit as exited:
            failure = exited.__context__
            if isinstance(failure, OSError):
                raise failure from None
            raise RuntimeError(f"the admin endpoint did not start (uvicorn exited with {exited.code})") from None

    task = asyncio.ensure_future(serving())
    try:
        while not server.started and not task.done():  # noqa: ASYNC110 (uvicorn exposes a flag, not an event)
            await asyncio.sleep(0.01)
        if server.started and started is not None:
            started(server.servers[0].sockets[0].getsockname()[1])
        await task
    finally:
        server.should_exit = True
        if not task.done():
            await asyncio.shield(task)
