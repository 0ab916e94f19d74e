"""Which request bodies the HTTP integrations send twice, and what a failed response holds while
its retry sleeps, against a real server (uvicorn on loopback).

A body a second attempt cannot send identically (a file part that cannot seek back, an async
iterable) is sent once: the server receives exactly one request and the caller gets its answer.
A replayable one is retried with the identical bytes. Before a retry's backoff sleep, the failed
response gives its connection back (a small body read first so the connection is reused, any
other closed), so a pool of one serves another request during the backoff; a failed response
the caller gets back (no retry follows) is never touched, its body readable."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from _uvicorn import read_body, serving

import stoic
from stoic import RetryBudget, Retrying, Schedule
from stoic.aiohttp import ResilientMiddleware
from stoic.httpx import AsyncResilientTransport, ResilientTransport
from stoic.testing import VirtualClock

pytestmark = pytest.mark.integration

LARGE = 1024 * 1024  # bytes: over the 64 KiB a failed response's body is read up to, and over what
# aiohttp buffers on its own (it gives a connection back once the whole body is in its buffer)


class App:
    """503 to the first hit of a path, 200 after (always 200 under ``/healthy``). The body is
    ``hit N``, sent with a ``Content-Length``, except under ``/chunked/`` (no length: uvicorn
    sends it chunked) and ``/large/`` (``LARGE`` bytes). Keeps each path's request bodies and
    the client port each came from (the connection it used)."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {}
        self.ports: dict[str, list[int]] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        path = scope["path"]
        seen = self.bodies.setdefault(path, [])
        seen.append(body)
        self.ports.setdefault(path, []).append(scope["client"][1])
        status = 503 if len(seen) == 1 and not path.startswith("/healthy") else 200
        text = f"hit {len(seen)}".encode()
        if path.startswith("/large/"):
            text = text.ljust(LARGE, b".")
        headers = [] if path.startswith("/chunked/") else [(b"content-length", str(len(text)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": text})


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, App]]:
    app = App()
    with serving(app) as url:
        yield url, app


class _OneShot(io.RawIOBase):
    """A readable stream that cannot seek (a pipe's, a socket's): its content can be read once."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), len(self._data))
        buffer[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


def one_shot(data: bytes) -> io.BufferedReader:
    return io.BufferedReader(_OneShot(data))  # seekable() is False, seek() and tell() raise


class Refusing:
    """A file-like object with no seekable(), whose seek() raises: only read() works."""

    name = "refusing.bin"

    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, size: int = -1) -> bytes:
        size = len(self._data) if size < 0 else size
        chunk, self._data = self._data[:size], self._data[size:]
        return chunk

    def seek(self, *args: Any) -> int:
        raise io.UnsupportedOperation("seek")


def retry(clock: VirtualClock | None = None, delay: float = 0.01) -> Retrying:
    return Retrying(Schedule.fixed(delay).attempts(3), label="http-retry", budget=RetryBudget.UNLIMITED,
                    clock=clock)


# --- 1. which bodies are sent twice ---------------------------------------------------------

@pytest.mark.parametrize("make", [one_shot, Refusing], ids=["unseekable", "seek-raises"])
async def test_an_httpx_multipart_file_that_cannot_seek_back_is_sent_once(server, make):
    url, app = server
    path = f"/once/httpx-async/{make.__name__}"
    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(retry=retry())) as client:
        r = await client.put(path, data={"field": "value"}, files={"f": ("f.bin", make(b"read once"))})
        assert r.status_code == 503 and r.text == "hit 1"  # the server's one answer
    assert len(app.bodies[path]) == 1 and b"read once" in app.bodies[path][0]


def test_a_blocking_httpx_multipart_file_that_cannot_seek_back_is_sent_once(server):
    url, app = server
    with httpx.Client(base_url=url, transport=ResilientTransport(retry=retry())) as client:
        r = client.put("/once/httpx-sync", files={"f": ("f.bin", one_shot(b"read once"))})
        assert r.status_code == 503 and r.text == "hit 1"
    assert len(app.bodies["/once/httpx-sync"]) == 1


async def test_an_httpx_multipart_form_of_seekable_files_and_bytes_is_retried_identically(server, tmp_path):
    url, app = server
    path = tmp_path / "part"
    path.write_bytes(b"file part")
    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(retry=retry())) as client:
        with path.open("rb") as f:
            files = {"a": f, "b": ("b.bin", io.BytesIO(b"bytes io part")), "c": ("c.txt", b"bytes part")}
            r = await client.put("/twice/httpx", data={"field": "value"}, files=files)
        assert r.status_code == 200 and r.text == "hit 2"
    first, second = app.bodies["/twice/httpx"]
    assert first == second and b"file part" in first and b"bytes io part" in first and b"bytes part" in first


async def _aiohttp_put(url: str, path: str, data: Any) -> tuple[int, str]:
    async with aiohttp.ClientSession(base_url=url, middlewares=(ResilientMiddleware(retry=retry()),)) as http, \
            http.put(path, data=data) as r:
        return r.status, await r.text()


async def _chunks() -> AsyncIterator[bytes]:
    yield b"streamed "
    yield b"part"


def _form_with_one_shot_file() -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field("field", "value")
    form.add_field("f", one_shot(b"read once"), filename="f.bin")
    return form


def _multipart_with_an_async_iterable() -> aiohttp.MultipartWriter:
    writer = aiohttp.MultipartWriter("mixed")
    writer.append(b"bytes part")
    writer.append(_chunks())
    return writer


def _nested_multipart_with_a_one_shot_file() -> aiohttp.MultipartWriter:
    inner = aiohttp.MultipartWriter("mixed")
    inner.append(one_shot(b"read once"))
    outer = aiohttp.MultipartWriter("mixed")
    outer.append(b"bytes part")
    outer.append(inner)
    return outer


@pytest.mark.parametrize("make", [
    _form_with_one_shot_file, _multipart_with_an_async_iterable, _nested_multipart_with_a_one_shot_file,
    lambda: one_shot(b"read once"),
], ids=["form-unseekable-file", "multipart-async-iterable", "nested-multipart-unseekable", "unseekable-file"])
async def test_an_aiohttp_body_that_cannot_be_sent_again_is_sent_once(server, make, request):
    url, app = server
    path = f"/once/aiohttp/{request.node.callspec.id}"
    assert await _aiohttp_put(url, path, make()) == (503, "hit 1")
    assert len(app.bodies[path]) == 1  # never a second request with an empty part


def _form_with_seekable_files(tmp_path: Any) -> aiohttp.FormData:
    path = tmp_path / "form-part"
    path.write_bytes(b"file part")
    form = aiohttp.FormData()
    form.add_field("field", "value")
    form.add_field("a", path.open("rb"), filename="a.bin")
    form.add_field("b", io.BytesIO(b"bytes io part"), filename="b.bin")
    return form


def _multipart_of_bytes_and_a_file(tmp_path: Any) -> aiohttp.MultipartWriter:
    path = tmp_path / "multipart-part"
    path.write_bytes(b"file part")
    writer = aiohttp.MultipartWriter("mixed")
    writer.append(b"bytes part")
    writer.append(path.open("rb"))
    writer.append_json({"json": "part"})
    return writer


def _a_seekable_file(tmp_path: Any) -> Any:
    path = tmp_path / "whole"
    path.write_bytes(b"file part")
    return path.open("rb")


@pytest.mark.parametrize("make", [_form_with_seekable_files, _multipart_of_bytes_and_a_file, _a_seekable_file],
                         ids=["form", "multipart", "file"])
async def test_an_aiohttp_body_that_can_be_sent_again_is_retried_identically(server, make, tmp_path, request):
    url, app = server
    path = f"/twice/aiohttp/{request.node.callspec.id}"
    assert await _aiohttp_put(url, path, make(tmp_path)) == (200, "hit 2")
    first, second = app.bodies[path]
    assert first == second and b"file part" in first


# --- 2. no connection held through a backoff -------------------------------------------------

async def _in_backoff(clock: VirtualClock, app: App, path: str) -> None:
    """Until the request to ``path`` failed and its retry sleeps on ``clock``."""
    for _ in range(500):
        if path in app.bodies and clock.pending_timers == 1:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never reached its backoff")


@pytest.mark.parametrize("kind", ["small", "chunked", "large"])
async def test_an_httpx_retry_in_its_backoff_holds_no_connection_of_a_pool_of_one(server, kind):
    url, app = server
    clock = VirtualClock()
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1))
    transport = AsyncResilientTransport(inner, retry=retry(clock, delay=60.0))
    path = f"/{kind}/httpx-async-backoff"
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=httpx.Timeout(5.0, pool=0.5)) as client:
        retried = asyncio.create_task(client.get(path))
        try:
            await _in_backoff(clock, app, path)
            r = await client.post("/healthy/httpx-async-backoff")  # not PoolTimeout
            assert r.status_code == 200 and not retried.done() and clock.now() == 0.0  # within the backoff
        finally:
            await clock.advance(60.0)
        r = await retried
        assert r.status_code == 200 and r.text.startswith("hit 2") and len(r.content) == len(r.text)
    if kind == "small":  # its body was read: the connection went back to the pool and served the next
        assert app.ports["/healthy/httpx-async-backoff"] == app.ports[path][:1]


@pytest.mark.parametrize("kind", ["small", "chunked", "large"])
def test_a_blocking_httpx_retry_in_its_backoff_holds_no_connection_of_a_pool_of_one(server, kind):
    url, app = server
    clock = VirtualClock()
    inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=1))
    transport = ResilientTransport(inner, retry=retry(clock, delay=60.0))
    path = f"/{kind}/httpx-sync-backoff"
    results: list[Any] = []
    with httpx.Client(base_url=url, transport=transport, timeout=httpx.Timeout(5.0, pool=0.5)) as client:
        retried = threading.Thread(target=lambda: results.append(client.get(path)))
        retried.start()
        try:
            for _ in range(500):
                if path in app.bodies:
                    break
                threading.Event().wait(0.01)
            # The retried request sleeps on the virtual clock until it is advanced, below.
            r = client.post("/healthy/httpx-sync-backoff")  # not PoolTimeout
            assert r.status_code == 200 and retried.is_alive()
        finally:
            asyncio.run(clock.advance(60.0))
            retried.join(10)
    assert results[0].status_code == 200 and results[0].text.startswith("hit 2")


@pytest.mark.parametrize("kind", ["small", "chunked", "large"])
async def test_an_aiohttp_retry_in_its_backoff_holds_no_connection_of_a_pool_of_one(server, kind):
    url, app = server
    clock = VirtualClock()
    middleware = ResilientMiddleware(retry=retry(clock, delay=60.0))
    path = f"/{kind}/aiohttp-backoff"
    async with aiohttp.ClientSession(base_url=url, middlewares=(middleware,),
                                     connector=aiohttp.TCPConnector(limit=1)) as http:

        async def get() -> tuple[int, str]:
            async with http.get(path) as response:
                return response.status, await response.text()

        retried = asyncio.create_task(get())
        try:
            await _in_backoff(clock, app, path)
            # (connect: the longest wait for a connection of the pool)
            async with http.post("/healthy/aiohttp-backoff", timeout=aiohttp.ClientTimeout(total=5, connect=0.5)) as r:
                assert r.status == 200 and not retried.done() and clock.now() == 0.0
        finally:
            await clock.advance(60.0)
        status, text = await retried
        assert status == 200 and text.startswith("hit 2")
    if kind == "small":
        assert app.ports["/healthy/aiohttp-backoff"] == app.ports[path][:1]


# --- what the caller gets when no retry follows: the failed response, untouched ------------

def _no_retry_follows(how: str) -> tuple[Retrying, Any]:
    """A retry that does not retry the first failure, and a factory of the scope to run the request in."""
    import contextlib

    if how == "exhausted":
        return Retrying(Schedule.fixed(0.01).attempts(1), label="one-try"), contextlib.nullcontext
    if how == "budget":
        empty = RetryBudget(ratio=0.1, reserve_per_second=0.0, reserve_capacity=0)
        return Retrying(Schedule.fixed(0.01).attempts(3), label="no-budget", budget=empty), contextlib.nullcontext
    # deadline skip: the 30 s delay would pass the request's 10 s deadline
    return Retrying(Schedule.fixed(30.0).attempts(3), label="long-retry"), lambda: stoic.timeout(10.0)


@pytest.mark.parametrize("how", ["exhausted", "budget", "deadline"])
@pytest.mark.parametrize("kind", ["chunked", "large"])
async def test_the_failed_response_returned_when_no_retry_follows_is_readable(server, kind, how):
    url, app = server
    retrying, scope = _no_retry_follows(how)
    async with httpx.AsyncClient(base_url=url, transport=AsyncResilientTransport(retry=retrying)) as client:
        async with scope():
            r = await client.get(f"/{kind}/httpx-readable-{how}")
        assert r.status_code == 503 and r.text.startswith("hit 1")
    async with aiohttp.ClientSession(base_url=url, middlewares=(ResilientMiddleware(retry=retrying),)) as http, \
            scope(), http.get(f"/{kind}/aiohttp-readable-{how}") as response:
        assert response.status == 503 and (await response.text()).startswith("hit 1")
    assert len(app.bodies[f"/{kind}/httpx-readable-{how}"]) == len(app.bodies[f"/{kind}/aiohttp-readable-{how}"]) == 1
