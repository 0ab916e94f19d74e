"""A hostile production user's second review of the control plane and keyed families: a retuned
family builds its later keys exactly as it retuned the keys it held, and what the control plane
shows of a family is what it acts on."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from stoic import (
    BlockingRateLimiter,
    CircuitBreaker,
    ControlPlane,
    Hedge,
    Keyed,
    RateLimiter,
    RetryBudget,
    use_sinks,
)
from stoic.fleet import BlockingSharedRateLimiter, RedisStore, SharedCircuitBreaker, SharedRateLimiter
from stoic.keyed import OVERFLOW_KEY
from stoic.testing import RecordingSink, VirtualClock


def breaker_factory(**config: Any) -> CircuitBreaker:
    """A family's factory of its own (its keys are rebuilt by a retune, not retuned in place)."""
    return CircuitBreaker(**config)


@pytest.mark.parametrize("factory", [RateLimiter, BlockingRateLimiter])
@pytest.mark.parametrize("burst", [{}, {"burst": 5}])
def test_a_limiter_familys_later_keys_get_the_burst_its_held_keys_were_retuned_to(
        factory: type, burst: dict[str, int], clock: VirtualClock) -> None:
    # A burst equal to the rate (or none given) follows the rate across a retune: every key's,
    # those held then and those built later alike (one family, one configuration).
    family = Keyed(factory, label="tenants", rate=5, clock=clock, **burst)
    plane = ControlPlane(clock=clock)
    plane.register(family)
    held = family.get("held")
    plane.retune("tenants", rate=10)
    later = family.get("later")
    assert (held.rate, held.burst) == (later.rate, later.burst) == (10, 10)
    # An explicit burst of its own stays as it is, on every key.
    plane.retune("tenants", burst=3)
    plane.retune("tenants", rate=20)
    newest = family.get("newest")
    assert [(p.rate, p.burst) for p in (held, later, newest)] == [(20, 3)] * 3


@pytest.mark.parametrize("factory, config, change", [
    (SharedRateLimiter, {"rate": 5}, {"rate": 10}),
    (BlockingSharedRateLimiter, {"rate": 5}, {"rate": 10}),
    (SharedCircuitBreaker, {}, {"minimum_calls": 3}),
])
@pytest.mark.parametrize("holding", [True, False])
def test_a_family_of_fleet_policies_is_refused_a_retune_as_a_plain_one_is(
        factory: type, config: dict[str, Any], change: dict[str, Any], holding: bool) -> None:
    # Their configuration is the fleet's (every process's, over one store): a family rebuilding its
    # keys with this process's own would diverge from the others', as a plain one is refused for.
    store = RedisStore("redis://127.0.0.1:1/0")  # never reached: the refusal comes first
    plane = ControlPlane()
    family = plane.register(Keyed(factory, label="fleet", store=store, **config))
    held = family.get("a") if holding else None
    sink = RecordingSink()
    with use_sinks(sink), pytest.raises(TypeError, match="cannot be retuned"):
        plane.retune("fleet", **change)
    assert dict(family.config) == {"store": store, **config}
    assert not holding or family.get("a") is held
    assert not sink.of("control.retuned")


@pytest.mark.parametrize("factory", [CircuitBreaker, breaker_factory])
def test_a_key_cleared_under_a_family_wide_force_stays_cleared_across_a_retune(
        factory: Any, clock: VirtualClock) -> None:
    # The incident's canary: every key forced open, one let through again; a retune then keeps
    # each key as it is (in place or rebuilt), never re-forcing the key the operator cleared.
    plane = ControlPlane(clock=clock)
    family = plane.register(Keyed(factory, label="deps", clock=clock, minimum_calls=5))
    family.get("canary"), family.get("other")
    assert plane.force_open("deps") == 2
    assert plane.clear_forced_open("deps", "canary") == 1
    plane.retune("deps", minimum_calls=7)
    assert str(family.get("canary").state) == "closed"
    assert str(family.get("other").state) == "open"
    assert str(family.get("new").state) == "open"  # built later: forced, until the family is cleared



@pytest.mark.parametrize("room", ["idle", "capacity"])
async def test_a_key_dropped_to_make_room_for_one_whose_factory_fails_is_still_an_event(
        room: str, clock: VirtualClock) -> None:
    def factory(*, label: str, clock: Any, **config: Any) -> CircuitBreaker:
        if label.endswith(":down"):
            raise ConnectionError("the key's dependency cannot be reached to build its client")
        return CircuitBreaker(label=label, clock=clock, **config)

    family = Keyed(factory, label="hosts", max_keys=1, idle_after=10.0, clock=clock)
    family.get("up")
    if room == "idle":
        await clock.advance(11.0)
    sink = RecordingSink()
    with use_sinks(sink), pytest.raises(ConnectionError):
        family.get("down")
    assert "up" not in family  # dropped to make room: its event says so
    assert [(e.attributes["key"], e.attributes["reason"]) for e in sink.of("keyed.evicted")] == [("up", room)]


def test_a_real_key_named_like_the_overflow_comes_first_in_policies_and_inspect_too() -> None:
    # A tenant id is data: "_other" may be one. The control plane acts on the real key of that
    # name (the docs: it comes first); what it shows under that key must be the same policy.
    family = Keyed(CircuitBreaker, label="hosts", max_keys=1)
    real = family.get(OVERFLOW_KEY)
    real.force_open()  # busy: the next key goes to the overflow policy
    overflow = family.get("x")
    assert overflow is not real
    assert family.policies[OVERFLOW_KEY] is real
    plane = ControlPlane()
    plane.register(family)
    assert [(s.key, s.state, s.forced_open) for s in plane.inspect("hosts")] == [(OVERFLOW_KEY, "open", True)]
    assert plane.clear_forced_open("hosts", OVERFLOW_KEY) == 1  # the one inspect showed forced


def test_a_hedge_familys_per_call_site_budget_is_the_familys_line_not_one_inside_stoic() -> None:
    # PER_CALL_SITE is one budget for the line that constructed the hedge: for a family's keys,
    # the line that constructed the family. Built inside stoic, every family's every key in the
    # process would spend one bucket, named after a line of stoic/keyed.py.
    here = f"{__file__}:{sys._getframe().f_lineno + 1}"
    first = Keyed(Hedge, label="first", delay=0.1)
    second = Keyed(Hedge, label="second", delay=0.1)
    assert first.get("x").budget is first.get("y").budget
    assert first.get("x").budget is not second.get("x").budget
    assert first.get("x").budget.name == here
    first.retune(budget=RetryBudget.PER_CALL_SITE, max_attempts=3)  # re-resolved at the same line
    assert first.get("x").budget.name == here and first.get("new").budget is first.get("x").budget


class TwoHedges:
    """A policy class of one's own holding two hedges, each constructed on a line of its own."""

    def __init__(self, *, label: str, clock: Any = None) -> None:
        self.label = label
        self.reads = Hedge(0.1, label=f"{label}:reads", clock=clock)
        self.writes = Hedge(0.1, label=f"{label}:writes", clock=clock)


def test_a_factory_class_of_ones_own_keeps_the_sites_of_its_own_lines() -> None:
    family = Keyed(TwoHedges, label="own")
    policy = family.get("x")
    assert policy.reads.budget is not policy.writes.budget
    assert policy.reads.budget.name.startswith(__file__)
