"""What production traffic does to stoic.asgi.LoadShedding that tests/test_asgi_shedding.py does
not try: deadline headers at the edges of what a float reads, and an admission policy that
would run the application twice."""

from __future__ import annotations

from typing import Any

import pytest

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
