"""Keyed families against a small reference model (hypothesis): which keys are held after any
sequence of uses, forced trips and time passing; the bounds on keys and labels always hold."""

from __future__ import annotations

from _keyed import IDLE, MAX_KEYS, Model, ops
from hypothesis import given, settings

from stoic import CircuitBreaker, Keyed
from stoic.keyed import OVERFLOW_KEY
from stoic.testing import VirtualClock

MAX_LABELS = 3


@settings(max_examples=200, deadline=None)
@given(ops)
def test_the_family_holds_what_the_model_holds(steps):
    clock = VirtualClock()
    family = Keyed(CircuitBreaker, label="m", max_keys=MAX_KEYS, max_labels=MAX_LABELS, idle_after=IDLE, clock=clock)
    model = Model()
    labels: set[str] = set()
    for op, arg in steps:
        if op == "wait":
            clock._set_now(clock.now_ns() + round(arg * 1e9))
            model.now += arg
            continue
        key = f"k{arg}"
        if op == "get":
            own = model.get(key)
            policy = family.get(key)
            labels.add(policy.label)
            if not own:
                assert policy.label == f"m:{OVERFLOW_KEY}"
        elif key in model.held:
            if op == "force":
                family.get(key).force_open()  # a use: it moves to the end
                model.forced.add(key)
                model.touch(key)
            else:
                family.clear_forced_open(key)  # a control action, not a use
                model.forced.discard(key)
        assert list(family) == list(model.held), (list(family), list(model.held))
        assert len(family) <= MAX_KEYS
        assert len(labels) <= MAX_LABELS + 1
