"""The control plane: registry, inspect per (policy, key), force/clear, retune, and its events
(seed 003, "Control plane")."""

from __future__ import annotations

import asyncio

import pytest

from stoic import (
    Bulkhead,
    CircuitBreaker,
    CircuitOpen,
    ControlPlane,
    CountWindow,
    Hedge,
    Keyed,
    RateLimiter,
    UnknownPolicy,
)


class Throttle:
    """Stands in for the adaptive throttle: only the duck-typed property the plane reads."""

    label = "shed"
    probability = 0.25


class Adaptive:
    """Stands in for an adaptive bulkhead: limit / in_use / queued properties."""

    def __init__(self, *, label: str, clock: object = None, initial: int = 10) -> None:
        if initial < 1:
            raise ValueError(f"initial must be >= 1, got {initial}")
        self.label = label
        self.limit = initial
        self.in_use = 0
        self.queued = 0


def plane(clock) -> tuple[ControlPlane, Keyed[CircuitBreaker]]:
    cp = ControlPlane(clock=clock)
    hosts = Keyed(CircuitBreaker, label="hosts", clock=clock, window=CountWindow(4), minimum_calls=2)
    cp.register(hosts)
    cp.register(RateLimiter(10, label="ingress", clock=clock))
    cp.register(Bulkhead(3, queue_limit=2, label="db", clock=clock))
    cp.register(Hedge(0.05, label="search", clock=clock))
    cp.register(Throttle())
    cp.register(Keyed(Adaptive, label="adaptive", clock=clock, initial=7))
    return cp, hosts


async def test_inspect_reads_every_kind_per_policy_and_key(clock, sink):
    cp, hosts = plane(clock)
    hosts.get("a.example")
    hosts.get("b.example").force_open()
    cp.get("adaptive").get("t1")
    states = {(s.policy, s.key): s for s in cp.inspect()}
    assert set(states) == {("hosts", "a.example"), ("hosts", "b.example"), ("ingress", None), ("db", None),
                           ("search", None), ("shed", None), ("adaptive", "t1")}
    a, b = states["hosts", "a.example"], states["hosts", "b.example"]
    assert (a.state, a.forced_open, a.label) == ("closed", False, "hosts:a.example")
    assert (b.state, b.forced_open, b.retry_after) == ("open", True, None)
    assert (states["ingress", None].available_permits, states["ingress", None].waiters) == (10, 0)
    db = states["db", None]
    assert (db.limit, db.in_use, db.queued, db.kind) == (3, 0, 0, "Bulkhead")
    assert states["search", None].hedge_delay == pytest.approx(0.05)
    assert states["shed", None].probability == 0.25
    assert (states["adaptive", "t1"].limit, states["adaptive", "t1"].in_use) == (7, 0)
    assert b.as_dict()["forced_open"] is True and "probability" not in b.as_dict()
    assert [s.key for s in cp.inspect("hosts")] == ["a.example", "b.example"]
    with pytest.raises(UnknownPolicy):
        cp.inspect("nope")


async def test_inspect_sees_a_bulkhead_in_use(clock):
    cp, _ = plane(clock)
    db = cp.get("db")
    gate = asyncio.Event()
    tasks = [asyncio.create_task(db.execute(gate.wait)) for _ in range(5)]
    await asyncio.sleep(0)
    (state,) = cp.inspect("db")
    assert (state.in_use, state.queued) == (3, 2)
    gate.set()
    await asyncio.gather(*tasks)


async def test_force_open_and_clear_by_key_and_for_every_key_with_events(clock, sink):
    cp, hosts = plane(clock)
    hosts.get("a")
    hosts.get("b")
    assert cp.force_open("hosts", "a", actor="alice") == 1
    with pytest.raises(CircuitOpen):
        await hosts.execute("a", asyncio.sleep, 0)
    assert cp.force_open("hosts") == 2
    assert all(s.forced_open for s in cp.inspect("hosts"))
    assert cp.clear_forced_open("hosts", "b") == 1
    assert cp.clear_forced_open("hosts", actor="bob") == 1
    assert not any(s.forced_open for s in cp.inspect("hosts"))
    events = [(e.name, e.label, dict(e.attributes)) for e in sink.events if e.name.startswith("control.")]
    assert events == [
        ("control.forced_open", "hosts", {"policies": 1, "key": "a", "actor": "alice"}),
        ("control.forced_open", "hosts", {"policies": 2}),
        ("control.cleared", "hosts", {"policies": 1, "key": "b"}),
        ("control.cleared", "hosts", {"policies": 1, "actor": "bob"}),
    ]
    with pytest.raises(UnknownPolicy, match="no key 'zzz'"):
        cp.force_open("hosts", "zzz")
    with pytest.raises(UnknownPolicy):
        cp.force_open("nope")
    with pytest.raises(TypeError, match="cannot be forced open"):
        cp.force_open("db")
    with pytest.raises(UnknownPolicy, match="not keyed"):
        cp.force_open("db", "k")


async def test_a_plain_breaker_is_forced_and_a_self_opened_one_is_left_alone(clock):
    cp = ControlPlane(clock=clock)
    breaker = cp.register(CircuitBreaker(label="pay", minimum_calls=1, window=CountWindow(1), clock=clock))

    async def fail() -> None:
        raise OSError

    with pytest.raises(OSError):
        await breaker.execute(fail)
    assert str(breaker.state) == "open"
    assert cp.clear_forced_open("pay") == 0  # it opened by itself: not an operator's trip
    assert str(breaker.state) == "open"
    cp.force_open("pay")
    assert cp.clear_forced_open("pay") == 1 and str(breaker.state) == "closed"


def test_retune_validates_like_the_constructor_and_leaves_the_live_policy_unchanged(clock, sink):
    cp, hosts = plane(clock)
    a = hosts.get("a")
    with pytest.raises(ValueError, match="minimum_calls"):
        cp.retune("hosts", minimum_calls=0)
    assert hosts.get("a") is a
    with pytest.raises(TypeError, match="no parameter"):
        cp.retune("hosts", minimum_call=3)
    with pytest.raises(ValueError, match="initial"):
        cp.retune("adaptive", initial=0)
    assert cp.retune("hosts", actor="carol", failure_rate_threshold=0.9, minimum_calls=3) == 1
    assert hosts.get("a") is a and hosts.config["failure_rate_threshold"] == 0.9
    with pytest.raises(TypeError, match="cannot be retuned"):
        cp.retune("shed", k=4)  # a stand-in with no _retune of its own
    with pytest.raises(UnknownPolicy):
        cp.retune("nope", x=1)
    with pytest.raises(ValueError, match="max_concurrent"):
        cp.retune("db", max_concurrent=0)
    assert cp.get("db").max_concurrent == 3
    assert cp.retune("db", max_concurrent=4) == 1  # a plain policy, retuned in place
    assert cp.get("db").max_concurrent == 4
    first, second = sink.of("control.retuned")
    assert dict(first.attributes) == {"policies": 1, "parameters": "failure_rate_threshold,minimum_calls",
                                      "actor": "carol"}
    assert dict(second.attributes) == {"policies": 1, "parameters": "max_concurrent"}


def test_registry_names(clock):
    cp, hosts = plane(clock)
    assert cp.names == ("hosts", "ingress", "db", "search", "shed", "adaptive")
    assert cp.register(hosts) is hosts  # the same object again: fine
    with pytest.raises(ValueError, match="registered already"):
        cp.register(Bulkhead(1, label="db"))
    cp.register(Bulkhead(1, label="db"), name="db2")
    cp.unregister("db2")
    with pytest.raises(UnknownPolicy):
        cp.unregister("db2")
