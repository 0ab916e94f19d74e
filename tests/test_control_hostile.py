"""A hostile production user's review of the control plane: a refused control action changes
nothing, and a kill switch that cannot be thrown from here is refused, never dropped."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest

import stoic
from stoic import Bulkhead, CircuitBreaker, ControlPlane, Keyed
from stoic.fleet import RedisStore, SharedCircuitBreaker


class AsyncSwitch:
    """A breaker whose kill switch is a coroutine (as stoic.fleet's: a store round trip),
    reading as forced open."""

    def __init__(self, *, label: str, clock: Any = None) -> None:
        self.label = label
        self.state = "open"
        self.snapshot = type("Snap", (), {"state": "open", "retry_after": None})()

    async def force_open(self) -> None:
        raise AssertionError("never awaited by a synchronous control plane")

    async def force_closed(self) -> None:
        raise AssertionError("never awaited by a synchronous control plane")


async def test_a_refused_force_open_of_a_family_leaves_its_new_keys_working() -> None:
    family = Keyed(Bulkhead, label="bh", max_concurrent=2)
    await family.execute("a", asyncio.sleep, 0)
    control = ControlPlane()
    control.register(family)
    with pytest.raises(TypeError, match="cannot be forced open"):
        control.force_open("bh")  # an operator's mistake: a bulkhead is no breaker
    assert await family.execute("b", asyncio.sleep, 0, "ran") == "ran"  # a key built afterwards


def test_a_refused_force_open_of_a_family_does_not_force_the_keys_built_later() -> None:
    family = Keyed(AsyncSwitch, label="sw")
    family.get("a")
    control = ControlPlane()
    control.register(family)
    with pytest.raises(TypeError, match="asynchronous"):
        control.force_open("sw")
    family.get("b")  # built afterwards without a forced open attempted (it would raise)


def test_force_open_of_a_fleet_breaker_is_refused_not_silently_dropped(recwarn: pytest.WarningsRecorder) -> None:
    store = RedisStore("redis://127.0.0.1:1/0")  # never reached: the refusal comes first
    control = ControlPlane()
    control.register(SharedCircuitBreaker(label="fleet", store=store))
    sink = stoic.testing.RecordingSink()
    with stoic.use_sinks(sink), pytest.raises(TypeError, match="asynchronous"):
        control.force_open("fleet")
    assert not sink.of("control.forced_open")  # no event says it was done
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_clear_forced_open_of_an_asynchronous_switch_is_refused() -> None:
    control = ControlPlane()
    control.register(AsyncSwitch(label="one"))
    control.register(Keyed(AsyncSwitch, label="many"))
    control.get("many").get("k")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine never awaited would be a RuntimeWarning
        with pytest.raises(TypeError, match="asynchronous"):
            control.clear_forced_open("one")
        with pytest.raises(TypeError, match="asynchronous"):
            control.clear_forced_open("many")


def test_a_breaker_family_is_still_forced_and_cleared() -> None:
    family = Keyed(CircuitBreaker, label="hosts")
    family.get("a")
    control = ControlPlane()
    control.register(family)
    assert control.force_open("hosts") == 1
    assert str(family.get("b").state) == "open"  # a key built later is forced too
    assert control.clear_forced_open("hosts") == 2


def test_a_clock_that_is_not_one_is_refused_at_construction() -> None:
    with pytest.raises(TypeError, match="clock"):
        ControlPlane(clock="not a clock")  # type: ignore[arg-type]
    from stoic.fleet import SharedLatency

    store = RedisStore("redis://127.0.0.1:1/0")
    with pytest.raises(TypeError, match="clock"):
        SharedLatency(store=store, label="lat", clock=object())  # type: ignore[arg-type]


def test_an_admin_prefix_that_could_match_no_path_is_refused() -> None:
    from stoic.admin import admin_app

    control = ControlPlane()
    with pytest.raises(ValueError, match="prefix"):
        admin_app(control, token="t", prefix="admin")  # every route would answer 404
    with pytest.raises(TypeError, match="prefix"):
        admin_app(control, token="t", prefix=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="token"):
        admin_app(control, token=1234)  # type: ignore[arg-type]
    admin_app(control, token="t", prefix="/admin/")  # a trailing slash is fine


async def call_app(app: Any, method: str, path: str, body: bytes) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "method": method, "path": path, "headers": [(b"authorization", b"Bearer t")],
             "server": ("10.0.0.1", 9470)}
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], sent[1]["body"]


async def test_an_admin_body_nested_too_deep_is_malformed_json_not_an_internal_error() -> None:
    from stoic.admin import admin_app

    control = ControlPlane()
    control.register(CircuitBreaker(label="b"))
    app = admin_app(control, token="t")
    status, body = await call_app(app, "POST", "/policies/b/force-open", b"[" * 30000 + b"]" * 30000)
    assert status == 400 and b"JSON" in body
    assert str(control.get("b").state) == "closed"


def test_a_retune_that_cannot_keep_a_key_forced_changes_no_key() -> None:
    built: list[AsyncSwitch] = []

    def switches(*, label: str, clock: Any = None, size: int = 1) -> AsyncSwitch:
        switch = AsyncSwitch(label=label, clock=clock)
        built.append(switch)
        return switch

    family = Keyed(switches, label="sw", size=1)
    family.get("a")
    family.get("b")
    before = dict(family.policies)
    with pytest.raises(TypeError, match="asynchronous"):
        family.retune(size=2)  # the keys read as forced open: their new policies could not be forced
    assert dict(family.policies) == before and family.config["size"] == 1


def test_a_family_built_by_a_factory_function_is_forced_before_it_holds_a_key() -> None:
    # Keyed takes any callable taking label and clock; one that builds breakers was refused
    # ("holds function policies") while it held no key, and forced once it held one.
    def hosts(**config: Any) -> CircuitBreaker:
        return CircuitBreaker(minimum_calls=5, **config)

    control = ControlPlane()
    family = control.register(Keyed(hosts, label="hosts"))
    assert control.force_open("hosts") == 0
    assert str(family.get("a").state) == "open"  # built later: forced
    assert control.clear_forced_open("hosts") == 1 and str(family.get("a").state) == "closed"
    # A factory function building what is no breaker is still refused, and forces nothing later.
    control.register(Keyed(lambda **config: Bulkhead(2, **config), label="pools"))
    with pytest.raises(TypeError, match="'pools' holds Bulkhead policies, which cannot be forced open"):
        control.force_open("pools")
    with pytest.raises(TypeError, match="'bh' holds Bulkhead policies"):
        Keyed(Bulkhead, label="bh", max_concurrent=2).force_open()
    assert str(control.get("pools").get("x").in_use) == "0"


def test_clearing_a_family_that_holds_no_breakers_is_refused_as_for_a_plain_policy() -> None:
    # A plain Bulkhead's clear was a TypeError, a family of them answered "0 cleared" (and the
    # admin endpoint 200 instead of 400): the operator never learnt the name was wrong.
    control = ControlPlane()
    family = control.register(Keyed(Bulkhead, label="pools", max_concurrent=2))
    control.register(Bulkhead(2, label="pool"))
    for name in ("pool", "pools"):
        with pytest.raises(TypeError, match="cannot be forced open"):
            control.clear_forced_open(name)
    family.get("a")
    with pytest.raises(TypeError, match="cannot be forced open"):
        control.clear_forced_open("pools")
    with pytest.raises(TypeError, match="cannot be forced open"):
        control.clear_forced_open("pools", "a")
    breakers = control.register(Keyed(CircuitBreaker, label="hosts"))
    assert control.clear_forced_open("hosts") == 0  # a breaker family holding no key: nothing to clear
    control.force_open("hosts")
    assert control.clear_forced_open("hosts") == 0 and str(breakers.get("b").state) == "closed"
