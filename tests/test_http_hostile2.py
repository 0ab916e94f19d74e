"""Hostile cases for the HTTP integrations, against real servers (uvicorn on loopback): a caller
cancelled while the integration closes a response it will never return."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from _uvicorn import read_body, serving

from stoic import AdaptiveThrottle, Hedge, Retrying, Schedule, Throttled
from stoic.httpx import AsyncResilientTransport

pytestmark = pytest.mark.integration

BIG = 200_000  # bytes: a failed body over the 64 KiB read before a retry, so it is closed unread


class App:
    """Per path, the first hit fails (a 503 with a big body) and the later ones answer 200;
    ``/limited/...`` always answers 429.
    ``/hedge/...``: the failure comes after 0.1 s and the success after 0.3 s, so a hedge
    started at 0.05 s wins after the first attempt has failed (its response is the loser to
    close)."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        path = scope["path"]
        hit = self.hits[path] = self.hits.get(path, 0) + 1
        if path.startswith("/limited/"):  # the server's own rate limit, refusing everything
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-length", b"0"), (b"retry-after", b"1")]})
            await send({"type": "http.response.body", "body": b""})
            return
        hedged = path.startswith("/hedge/")
        if hit == 1:
            if hedged:
                await asyncio.sleep(0.1)
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-length", str(BIG).encode())]})
            await send({"type": "http.response.body", "body": b"x" * BIG})
            return
        if hedged:
            await asyncio.sleep(0.3)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serving(App()) as base:
        yield base


class _CancelsOnClose(httpx.AsyncByteStream):
    """A failed response's stream whose close starts by cancelling ``task`` (the caller): the
    cancellation lands at the first await inside httpx's own close."""

    def __init__(self, inner: httpx.AsyncByteStream, task: asyncio.Task[Any]) -> None:
        self.inner, self.task = inner, task

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            yield chunk

    async def aclose(self) -> None:
        self.task.cancel()
        await self.inner.aclose()


class _CancelOnFailedClose(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncHTTPTransport) -> None:
        self.inner = inner
        self.caller: asyncio.Task[Any] | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if response.status_code == 503:
            assert self.caller is not None
            response.stream = _CancelsOnClose(response.stream, self.caller)  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _cancelled_while_closing(url: str, **policies: Any) -> tuple[httpx.AsyncClient, httpx.AsyncHTTPTransport]:
    """One GET whose caller is cancelled as its failed response is being closed; the client
    and its pool after."""
    real = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=2))
    cancelling = _CancelOnFailedClose(real)
    client = httpx.AsyncClient(transport=AsyncResilientTransport(cancelling, **policies), timeout=5.0)
    task = asyncio.create_task(client.get(url))
    cancelling.caller = task
    with pytest.raises(asyncio.CancelledError):
        await task
    return client, real


async def _held(pool: httpx.AsyncHTTPTransport) -> list[str]:
    """The pool's connections still checked out, once the closes under way have had 1 s to end."""
    for _ in range(100):
        held = [repr(c) for c in pool._pool.connections if not (c.is_idle() or c.is_closed())]
        if not held:
            break
        await asyncio.sleep(0.01)
    return held


async def test_a_caller_cancelled_while_a_hedges_losing_response_closes_leaks_no_connection(url):
    # The hedge's winner (200) was to be returned and the loser (the first attempt's 503)
    # closed; the caller is cancelled during that close. Both must still be released: before,
    # the loser's close was cut short at its first await and the winner was never closed, and
    # both connections of the pool of two stayed checked out for good.
    client, pool = await _cancelled_while_closing(f"{url}/hedge/1", hedge=Hedge(0.05, label="h2-hedge"))
    assert await _held(pool) == []
    await client.aclose()


async def test_a_caller_cancelled_while_a_failed_response_closes_before_the_backoff_leaks_no_connection(url):
    # The retry closes the 503 (its body too big to read) before its backoff; the caller is
    # cancelled during that close. Before, the close was cut short and the connection stayed
    # checked out of the pool for good.
    client, pool = await _cancelled_while_closing(
        f"{url}/retry/1", retry=Retrying(Schedule.fixed(0.05).attempts(3), label="h2-retry"))
    assert await _held(pool) == []
    await client.aclose()


async def test_a_throttle_stage_sheds_against_a_server_whose_rate_limit_refuses_everything(url):
    """Every request the server answers 429 is one it did not accept: the throttle stage sheds
    (up to its cap) instead of sending every request into the server's refusal."""
    throttle = AdaptiveThrottle(label="limited")
    async with httpx.AsyncClient(transport=AsyncResilientTransport(stages=[throttle]), timeout=5.0) as client:
        answered = shed = 0
        for _ in range(200):
            try:
                response = await client.get(f"{url}/limited/a")
            except Throttled:
                shed += 1
            else:
                assert response.status_code == 429
                answered += 1
    assert throttle.requests == 200 and throttle.accepts == 0
    assert shed > 100 and answered == 200 - shed
