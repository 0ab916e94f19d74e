"""Keyed families under test: the reference model of the keys a family holds (hypothesis: a
family of ``MAX_KEYS`` keys idle after ``IDLE`` seconds, after any sequence of uses, forced trips
and time passing), and a record of every policy a family builds."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import strategies as st

import stoic

MAX_KEYS, IDLE = 4, 10.0
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


def record_builds(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every policy any ``stoic.Keyed`` family builds from now on (for this test), in order."""
    built: list[Any] = []
    build = stoic.Keyed._build

    def recording_build(self: stoic.Keyed[Any], label: str) -> Any:
        policy = build(self, label)
        built.append(policy)
        return policy

    monkeypatch.setattr(stoic.Keyed, "_build", recording_build)
    return built
