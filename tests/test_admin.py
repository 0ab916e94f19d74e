"""The admin endpoint through a real server (uvicorn on loopback) and httpx: routes, the token,
bad input, and that nothing but validation messages leaves it (seed 003, "Control plane")."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from _uvicorn import serving

from stoic import Bulkhead, CircuitBreaker, ControlPlane, CountWindow, Keyed
from stoic.admin import admin_app, is_loopback, serve_admin

pytestmark = pytest.mark.integration


class Secretive:
    """A policy whose state reading raises with a secret in the message."""

    label = "secretive"

    @property
    def in_use(self) -> int:
        raise RuntimeError("password=hunter2")


@pytest.fixture
def control() -> ControlPlane:
    cp = ControlPlane()
    hosts = cp.register(Keyed(CircuitBreaker, label="hosts", window=CountWindow(4), minimum_calls=2))
    hosts.get("a.example")
    hosts.get("b.example")
    cp.register(Bulkhead(2, label="db"))
    return cp


@pytest.fixture
def client(control: ControlPlane) -> Iterator[httpx.Client]:
    with serving(admin_app(control, token="s3cret", prefix="/admin")) as url, \
            httpx.Client(base_url=url, headers={"Authorization": "Bearer s3cret"}) as http:
        yield http


def test_inspect_force_open_clear_and_retune_over_http(client: httpx.Client, control: ControlPlane):
    r = client.get("/admin/policies")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    rows = {(p["policy"], p["key"]): p for p in r.json()["policies"]}
    assert rows["hosts", "a.example"]["state"] == "closed" and rows["db", None]["limit"] == 2
    r = client.post("/admin/policies/hosts/force-open", json={"key": "a.example", "actor": "alice"})
    assert r.status_code == 200 and r.json() == {"policy": "hosts", "key": "a.example", "forced_open": 1}
    assert str(control.get("hosts").get("a.example").state) == "open"
    one = client.get("/admin/policies/hosts").json()["policies"]
    assert {p["key"]: p["forced_open"] for p in one} == {"a.example": True, "b.example": False}
    assert client.post("/admin/policies/hosts/clear", json={}).json()["cleared"] == 1
    r = client.post("/admin/policies/hosts/retune", json={"changes": {"minimum_calls": 3}})
    assert r.status_code == 200 and r.json()["retuned"] == 2
    assert control.get("hosts").config["minimum_calls"] == 3
    r = client.post("/admin/policies/db/retune", json={"changes": {"max_concurrent": 5, "queue_limit": None}})
    assert r.status_code == 200 and r.json() == {"policy": "db", "retuned": 1,
                                                 "parameters": ["max_concurrent", "queue_limit"]}
    assert control.get("db").max_concurrent == 5 and control.get("db").queue_limit is None


@pytest.mark.parametrize(("method", "path", "body", "status", "says"), [
    ("post", "/admin/policies/hosts/force-open", {"key": "a.example", "who": "x"}, 400, "unknown field"),
    ("post", "/admin/policies/hosts/retune", {"changes": {"failure_rate_threshold": 7}}, 400,
     "failure_rate_threshold"),
    ("post", "/admin/policies/hosts/retune", {"changes": {"minimum_calls": -1}}, 400, "minimum_calls"),
    ("post", "/admin/policies/hosts/retune", {"changes": {"nonsense": 1}}, 400, "nonsense"),
    ("post", "/admin/policies/hosts/retune", {"changes": {"window": {"count": 3}}}, 400, "window"),
    ("post", "/admin/policies/hosts/retune", {"changes": {}}, 400, "changes"),
    ("post", "/admin/policies/hosts/force-open", {"key": 5}, 400, "key"),
    ("post", "/admin/policies/nope/force-open", {}, 404, "nope"),
    ("post", "/admin/policies/hosts/force-open", {"key": "c.example"}, 404, "c.example"),
    ("get", "/admin/policies/nope", None, 404, "nope"),
    ("post", "/admin/policies/db/force-open", {}, 400, "cannot be forced open"),
    ("post", "/admin/policies/db/retune", {"changes": {"max_concurrent": 0}}, 400, "max_concurrent"),
    ("post", "/admin/policies/db/retune", {"changes": {"label": "x"}}, 400, "label"),
    ("get", "/admin/policies/hosts/retune", None, 405, "POST"),
    ("delete", "/admin/policies", None, 405, "GET"),
    ("get", "/elsewhere", None, 404, "not found"),
])
def test_bad_input_gets_a_status_and_a_message(client, control, method, path, body, status, says):
    before = dict(control.get("hosts").config)
    db = repr(control.get("db"))
    kwargs: dict[str, Any] = {} if body is None else {"json": body}
    r = client.request(method.upper(), path, **kwargs)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]
    assert dict(control.get("hosts").config) == before  # nothing changed
    assert repr(control.get("db")) == db


def test_malformed_json_and_oversized_bodies(client):
    r = client.post("/admin/policies/hosts/force-open", content=b"{not json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    r = client.post("/admin/policies/hosts/force-open", content=b"[1, 2]")
    assert r.status_code == 400
    r = client.post("/admin/policies/hosts/force-open", content=b" " * (65 * 1024))
    assert r.status_code == 413


def test_the_token_is_required_and_checked(control):
    with serving(admin_app(control, token="s3cret")) as url:
        assert httpx.get(f"{url}/policies").status_code == 401
        assert httpx.get(f"{url}/policies", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{url}/policies", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        # The scheme is case-insensitive (RFC 9110 11.1); the token is not, nor another scheme it.
        assert httpx.get(f"{url}/policies", headers={"Authorization": "bearer s3cret"}).status_code == 200
        assert httpx.get(f"{url}/policies", headers={"Authorization": "BEARER  s3cret"}).status_code == 200
        for wrong in ("Bearer S3CRET", "Basic s3cret", "s3cret", "Bearer", "Bearers3cret", "Bearer s3cret x"):
            assert httpx.get(f"{url}/policies", headers={"Authorization": wrong}).status_code == 401, wrong
    with pytest.raises(ValueError, match="token"):
        admin_app(control, token="")


def test_without_a_token_only_loopback_is_served(control):
    with serving(admin_app(control)) as url:
        assert httpx.get(f"{url}/policies").status_code == 200  # loopback: allowed

    async def call(server: tuple[str, int]) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/policies", "headers": [], "server": server}
        await admin_app(control)(scope, receive, send)
        return sent

    refused = asyncio.run(call(("10.1.2.3", 8080)))
    assert refused[0]["status"] == 403
    assert asyncio.run(call(("::1", 8080)))[0]["status"] == 200
    with pytest.raises(ValueError, match="loopback"):
        asyncio.run(serve_admin(control, host="0.0.0.0"))
    assert is_loopback("127.0.0.5") and is_loopback("localhost") and not is_loopback("example.com")


def test_an_internal_error_reveals_nothing(control):
    control.register(Secretive())
    with serving(admin_app(control)) as url:
        r = httpx.get(f"{url}/policies/secretive")
    assert r.status_code == 500 and r.json() == {"error": "internal error"}
    assert "hunter2" not in r.text


async def test_serve_admin_runs_until_cancelled_and_reports_its_port(control):
    ports: list[int] = []
    task = asyncio.create_task(serve_admin(control, started=ports.append))
    while not ports:
        await asyncio.sleep(0.01)
    async with httpx.AsyncClient() as http:
        r = await http.post(f"http://127.0.0.1:{ports[0]}/policies/hosts/force-open", json={})
    assert r.json()["forced_open"] == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_serve_admin_on_a_port_in_use_raises_oserror_and_the_application_keeps_running(control):
    # uvicorn meets a port it cannot bind with sys.exit(): out of serve_admin's task that
    # SystemExit stopped the application's whole event loop (asyncio.run raised it).
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports: list[int] = []
    try:
        with pytest.raises(OSError) as refused:
            await asyncio.wait_for(serve_admin(control, port=taken.getsockname()[1], started=ports.append), 10)
    finally:
        taken.close()
    assert refused.value.errno == errno.EADDRINUSE and not ports
    await asyncio.sleep(0.01)  # the loop still runs
