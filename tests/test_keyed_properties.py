"""Keyed families against a small reference model (hypothesis): which keys are held after any
sequence of uses, forced trips and time passing; the bounds on keys and labels always hold."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from stoic import CircuitBreaker, Keyed
from stoic.keyed import OVERFLOW_KEY
from stoic.testing import VirtualClock

MAX_KEYS, MAX_LABELS, IDLE = 4, 3, 10.0
TOUCH = IDLE / 100  # a use within this long of the key's last touch neither reorders nor re-stamps it

ops = st.lists(st.one_of(
    st.tuples(st.just("get"), st.integers(0, 9)),
    st.tuples(st.just("force"), st.integers(0, 9)),
    st.tuples(st.just("clear"), st.integers(0, 9)),
    st.tuples(st.just("wait"), st.sampled_from([0.5, 3.0, 11.0])),
), max_size=60)


class Model:
    """Held keys in use order with their last use; forced keys are never dropped."""

    def __init__(self) -> None:
        self.held: OrderedDict[str, float] = OrderedDict()
        self.forced: set[str] = set()
        self.now = 0.0

    def touch(self, key: str) -> None:
        if self.now - self.held[key] >= TOUCH:
            self.held[key] = self.now
            self.held.move_to_end(key)

    def get(self, key: str) -> bool:
        """Whether ``key`` has its own policy after the use (False: the overflow one)."""
        if key in self.held:
            self.touch(key)
            return True
        for k in list(self.held):
            if self.held[k] > self.now - IDLE:
                break
            if k not in self.forced:
                del self.held[k]
        if len(self.held) >= MAX_KEYS:
            victim = next((k for k in self.held if k not in self.forced), None)
            if victim is None:
                return False
            del self.held[victim]
        self.held[key] = self.now
        return True


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
