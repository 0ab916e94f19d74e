"""What production traffic does to stoic.asgi.LoadShedding that tests/test_asgi_shedding.py does
not try: deadline headers at the edges of what a float reads, an admission policy that would
run the application twice, an application that raises or whose client hangs up (behind
uvicorn), and the scopes that are not requests."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import httpx
import pytest
from _uvicorn import serving

from stoic import Bulkhead, Pipeline, Retrying, Schedule
from stoic.asgi import LoadShedding


async def ok_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def call(app: Any, headers: list[tuple[bytes, bytes]], path: str = "/") -> list[dict[str, Any]]:
    """One HTTP request through ``app`` in process: the messages it sent."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": "GET", "path": path, "headers": headers}, receive, send)
    return sent


@pytest.mark.parametrize("value", [b"-inf", b"-Infinity", b"-1e400", b"-1", b"0", b"-0", b"1e-400"])
async def test_a_deadline_header_of_zero_or_less_is_a_504_even_when_it_is_minus_infinity(value):
    # docs/asgi.md: "0 or less is answered 504 at once". "-inf" (or "-1e400", which a float reads
    # as -inf) is less than 0, but was taken for an unparsable value and ignored: the request
    # ran with no deadline at all, as if the caller had all the time in the world.
    app = LoadShedding(ok_app, bulkhead=Bulkhead(1, label="ingress"), deadline_header="x-request-timeout")
    sent = await call(app, [(b"x-request-timeout", value)])
    assert sent[0]["status"] == 504


@pytest.mark.parametrize("value", [b"nan", b"inf", b"1e400", b"soon", b"", b"\xff"])
async def test_a_deadline_header_that_names_no_time_is_ignored(value):
    app = LoadShedding(ok_app, bulkhead=Bulkhead(1, label="ingress"), deadline_header="x-request-timeout")
    sent = await call(app, [(b"x-request-timeout", value)])
    assert sent[0]["status"] == 200


def test_admission_that_would_run_the_application_again_is_refused_at_construction():
    # docs/asgi.md invites "a stoic.Pipeline" as the bulkhead. One holding a Retrying (or a bare
    # Retrying) retried the application itself: an app that failed after answering (a backend
    # gone mid-body) ran again, sending http.response.start once more on the same request
    # whose body it had already read, three times under attempts(3): a broken response, and
    # the work done again. Refused where the middleware is built, as a Hedge is.
    retry = Retrying(Schedule.fixed(0.01).attempts(3), label="ingress-retry")
    for admission in (retry, Pipeline(retry, Bulkhead(4, label="ingress")),
                      Pipeline(Bulkhead(4, label="ingress"), Pipeline(retry))):
        with pytest.raises(TypeError, match="Retrying"):
            LoadShedding(ok_app, bulkhead=admission)


@pytest.mark.integration
def test_an_application_that_raises_or_whose_client_goes_away_gives_its_slot_back():
    # Behind uvicorn: an application error (a 500 from the server) and a client that hangs up
    # while its request runs must each give the bulkhead's slot back, or a few of them shed
    # every later request with 503 for ever.
    holding, gone = threading.Event(), threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/boom":
            raise RuntimeError("the application failed")
        if scope["path"] == "/wait":
            holding.set()  # (inside the bulkhead: the slot is this request's)
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            return
        await ok_app(scope, receive, send)

    bulkhead = Bulkhead(1, queue_limit=0, label="ingress")
    with serving(LoadShedding(app, bulkhead=bulkhead)) as url, httpx.Client(base_url=url, timeout=5) as client:
        for _ in range(3):
            assert client.get("/boom").status_code == 500
        assert client.get("/ok").status_code == 200
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
            assert holding.wait(5) and bulkhead.in_use == 1
            assert client.get("/ok").status_code == 503  # the slot is the hung request's
        assert gone.wait(5)
        for _ in range(500):  # (the application saw the hang-up; its return frees the slot next)
            if not bulkhead.in_use:
                break
            time.sleep(0.01)
        assert client.get("/ok").status_code == 200


async def test_lifespan_and_websocket_scopes_pass_through_without_taking_a_slot():
    # A lifespan (and a websocket) scope is not a request: a full bulkhead must not refuse the
    # server's startup, and no slot or permit is spent on it.
    class Never:
        async def execute(self, fn: Any, *args: Any) -> Any:
            raise AssertionError("admission asked for a scope that is not an HTTP request")

    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        seen.append(message["type"])
        await send({"type": "lifespan.startup.complete" if scope["type"] == "lifespan" else "websocket.accept"})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    shed = LoadShedding(app, bulkhead=Never())
    for scope_type, first in (("lifespan", "lifespan.startup"), ("websocket", "websocket.connect")):
        async def receive(first: str = first) -> dict[str, Any]:
            return {"type": first}

        await shed({"type": scope_type, "headers": []}, receive, send)
    assert seen == ["lifespan.startup", "websocket.connect"]
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "websocket.accept"]
