"""A real HTTP server for integration tests: uvicorn serving an ASGI app on a free loopback port,
in a thread with its own event loop (so sync and async clients alike can call it)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


@contextlib.contextmanager
def serving(app: Any, **config: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) for the block; yields ``http://127.0.0.1:<port>``.
    On uvicorn's h11 parser unless ``http=`` says otherwise (with httptools installed, uvicorn
    would otherwise pick it: every test runs on one parser, the keep-alive test on both)."""
    config.setdefault("http", "h11")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off",
                                           access_log=False, **config))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def read_body(receive: Any) -> bytes:
    """The whole request body an ASGI app receives, however many messages it comes in."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body  # type: ignore[no-any-return]
