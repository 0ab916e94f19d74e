"""The admin endpoint as an operator in an incident meets it: typed in a hurry (a wrong action,
a parameter that collides with the endpoint's own fields), driven straight through ASGI."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from stoic import AdaptiveBulkhead, Bulkhead, CircuitBreaker, ControlPlane, Keyed
from stoic.admin import admin_app
from stoic.testing import RecordingSink, VirtualClock


def _call(control: ControlPlane, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": [], "server": ("127.0.0.1", 9470)}
    asyncio.run(admin_app(control)(scope, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])


@pytest.fixture
def control() -> ControlPlane:
    clock = VirtualClock()
    plane = ControlPlane(clock=clock)
    plane.register(Bulkhead(2, label="db", clock=clock))
    plane.register(CircuitBreaker(label="deps", clock=clock))
    return plane


@pytest.mark.parametrize("path", ["/policies/deps/force_open", "/policies/deps/forceopen", "/policies/nope/nonsense"])
def test_a_mistyped_action_is_an_unknown_route_naming_the_actions_not_use_get(control: ControlPlane,
                                                                              path: str) -> None:
    # "use GET" sends an operator who mistyped force-open off in the wrong direction: no policy
    # is registered under that path, so there is nothing a GET would find either.
    status, body = _call(control, "POST", path, b"{}")
    assert status == 404
    assert "force-open" in body["error"] and "retune" in body["error"]
    assert str(control.get("deps").state) == "closed"


def test_a_wrong_method_on_a_policy_that_exists_is_still_405(control: ControlPlane) -> None:
    assert _call(control, "POST", "/policies/deps", b"{}") == (405, {"error": "use GET"})
    control.register(Bulkhead(1, label="db/slow"))  # a name with a slash in it is still found
    assert _call(control, "DELETE", "/policies/db/slow")[0] == 405
    assert _call(control, "GET", "/policies/db/slow")[1]["policies"][0]["limit"] == 1


@pytest.mark.parametrize("name", ["actor", "policy"])
def test_a_change_named_like_the_endpoints_own_fields_is_refused_as_no_parameter(control: ControlPlane,
                                                                                 name: str) -> None:
    status, body = _call(control, "POST", "/policies/db/retune", json.dumps({"changes": {name: 3}}).encode())
    assert status == 400
    assert f"{name!r} is not a parameter" in body["error"]
    assert "got multiple values" not in body["error"]  # not Python's call machinery, leaked as is
    assert control.get("db").max_concurrent == 2


def test_the_control_plane_takes_a_change_named_policy_as_a_parameter_of_the_policy() -> None:
    plane = ControlPlane(clock=VirtualClock())
    plane.register(Bulkhead(2, label="db"))
    with pytest.raises(TypeError, match="'policy' is not a parameter"):
        plane.retune("db", policy=3)


def test_the_answers_and_events_have_the_documented_shapes(sink: RecordingSink) -> None:
    # docs/control-plane.md (the admin table, inspect's fields per kind) and docs/events.md
    # (control.retuned: policies, parameters, actor?; never the values).
    clock = VirtualClock()
    plane = ControlPlane(clock=clock)
    family = plane.register(Keyed(AdaptiveBulkhead, label="pools", latency_threshold=1.0, max_concurrent=8,
                                  clock=clock))
    family.get("a")
    family.get("b")
    plane.register(CircuitBreaker(label="deps", clock=clock))
    status, body = _call(plane, "POST", "/policies/pools/retune",
                         json.dumps({"changes": {"max_concurrent": 4}, "actor": "alice"}).encode())
    assert (status, body) == (200, {"policy": "pools", "retuned": 2, "parameters": ["max_concurrent"]})
    status, body = _call(plane, "POST", "/policies/deps/force-open", b'{"actor": "bob"}')
    assert (status, body) == (200, {"policy": "deps", "key": None, "forced_open": 1})
    status, body = _call(plane, "GET", "/policies")
    rows = {(row["policy"], row["key"]): row for row in body["policies"]}
    assert set(rows["pools", "a"]) == {"policy", "key", "label", "kind", "limit", "in_use", "queued"}
    assert rows["pools", "a"]["limit"] == 4 and rows["pools", "a"]["label"] == "pools:a"
    assert set(rows["deps", None]) == {"policy", "key", "label", "kind", "state", "forced_open"}
    assert rows["deps", None]["state"] == "open" and rows["deps", None]["forced_open"] is True
    changed = sink.of("bulkhead.limit_changed")
    assert sorted(e.label for e in changed) == ["pools:a", "pools:b"]
    assert {dict(e.attributes)["cause"] for e in changed} == {"retune"}
    (retuned,) = sink.of("control.retuned")
    assert retuned.label == "pools" and retuned.level.name == "INFO"
    assert dict(retuned.attributes) == {"policies": 2, "parameters": "max_concurrent", "actor": "alice"}
    (forced,) = sink.of("control.forced_open")
    assert forced.level.name == "WARNING" and dict(forced.attributes) == {"policies": 1, "actor": "bob"}


def _exchange(control: ControlPlane, method: str, path: str) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": [], "server": ("127.0.0.1", 9470)}
    asyncio.run(admin_app(control)(scope, receive, send))
    return sent


@pytest.mark.parametrize("path", ["/policies", "/policies/db", "/policies/nope"])
def test_head_answers_as_get_does_without_the_body(control: ControlPlane, path: str) -> None:
    # A load balancer's health check or `curl -I` asks with HEAD (RFC 9110 9.3.2: the same
    # status and headers as GET, and no content).
    got, head = _exchange(control, "GET", path), _exchange(control, "HEAD", path)
    assert head[0] == got[0]
    assert head[1]["body"] == b"" and got[1]["body"] != b""


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("POST", "/policies", b"GET, HEAD"), ("DELETE", "/policies/db", b"GET, HEAD"),
    ("GET", "/policies/db/retune", b"POST"), ("HEAD", "/policies/db/force-open", b"POST"),
])
def test_a_405_says_which_methods_the_route_allows(control: ControlPlane, method: str, path: str,
                                                   allow: bytes) -> None:
    start = _exchange(control, method, path)[0]  # RFC 9110 15.5.6: a 405 carries Allow
    assert start["status"] == 405
    assert (b"allow", allow) in start["headers"]
