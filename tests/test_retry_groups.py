"""Field report 18: errors inside exception groups (docs/design.md, "Exception groups").

The rule for retry: a group with any Defect leaf is never retried; otherwise a built-in or
exception-type classifier judges the leaves, and the group is retried only if every leaf
would be, after the longest wait any leaf asks for. Checked over random nestings against a
small reference model, through the classifiers and through retry itself.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import stoic
from stoic import (
    BudgetExhausted,
    BulkheadFull,
    CircuitOpen,
    Defect,
    RetryBudget,
    RetryClassifier,
    RetryDecision,
    Schedule,
    retry_sync,
)
from stoic._classify import as_classifier
from stoic.testing import VirtualClock

CLASSIFIERS = {
    "standard": RetryClassifier.standard,
    "transient_only": RetryClassifier.transient_only,
    "on(ConnectionError)": as_classifier(ConnectionError),
    "on(ConnectionError, TimeoutError)": as_classifier((ConnectionError, TimeoutError)),
}


class Later(Exception):
    """A Retryable: a server said when to come back."""

    def __init__(self, after: int) -> None:
        super().__init__(after)
        self.retry_decision = RetryDecision.retry_after(after)


# (kind, seconds) -> the leaf; the model below says what each classifier makes of it.
LEAF_KINDS = ["connection", "timeout", "type", "value", "bulkhead", "open", "budget", "later", "defect"]


def make_leaf(kind: str, seconds: int) -> Exception:
    return {
        "connection": lambda: ConnectionError(),
        "timeout": lambda: TimeoutError(),
        "type": lambda: TypeError(),
        "value": lambda: ValueError(),
        "bulkhead": lambda: BulkheadFull(label="pool"),
        "open": lambda: CircuitOpen(label="db", retry_after=seconds),
        "budget": lambda: BudgetExhausted(label="inner"),
        "later": lambda: Later(seconds),
        "defect": lambda: Defect(),
    }[kind]()


STOP = ("stop", None)


def leaf_model(classifier: str, kind: str, seconds: int) -> tuple[str, int | None]:
    """("retry", wait seconds or None) or ("stop", None) for one leaf."""
    if kind == "later":
        return ("retry", seconds) if seconds > 0 else ("retry", None)  # its own decision, everywhere
    if classifier.startswith("on("):
        retried = {"connection"} | ({"timeout"} if "TimeoutError" in classifier else set())
        return ("retry", None) if kind in retried else STOP
    if kind in ("type", "budget"):
        return STOP
    if kind == "open":
        return ("retry", seconds) if seconds > 0 else ("retry", None)
    if kind in ("bulkhead", "connection", "timeout"):
        return ("retry", None)
    if kind in ("value", "defect"):
        return ("retry", None) if classifier == "standard" else STOP
    raise AssertionError(kind)


def group_model(classifier: str, leaves: list[tuple[str, int]]) -> tuple[str, int | None]:
    verdicts = [leaf_model(classifier, kind, seconds) for kind, seconds in leaves]
    if any(v == STOP for v in verdicts):
        return STOP
    waits = [w for _, w in verdicts if w is not None]
    return ("retry", max(waits) if waits else None)


Tree = Any  # a (kind, seconds) leaf or a list of trees
leaf_specs = st.tuples(st.sampled_from(LEAF_KINDS), st.integers(-3, 400))
trees = st.recursive(leaf_specs, lambda children: st.lists(children, min_size=1, max_size=4), max_leaves=10)


def build(tree: Tree) -> Exception:
    if isinstance(tree, tuple):
        return make_leaf(*tree)
    return ExceptionGroup("fan-out", [build(child) for child in tree])


def flatten(tree: Tree) -> list[tuple[str, int]]:
    if isinstance(tree, tuple):
        return [tree]
    return [leaf for child in tree for leaf in flatten(child)]


def as_model(decision: RetryDecision) -> tuple[str, int | None]:
    if not decision.retries:
        return STOP
    return ("retry", None if decision.after is None else round(decision.after))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(CLASSIFIERS)), trees)
@example("transient_only", [("connection", 0)])  # the field report: a ConnectionError from a TaskGroup
@example("on(ConnectionError)", [[("connection", 0)], ("connection", 0)])
@example("standard", [("open", 5), ("later", 30), ("bulkhead", 0)])
@example("standard", [("connection", 0), ("type", 0)])
@example("standard", [("open", -3), ("open", 0), ("later", 0)])
def test_classifiers_judge_a_group_by_its_leaves(name: str, tree: Tree) -> None:
    error = build(tree)
    assert as_model(CLASSIFIERS[name](error)) == group_model(name, flatten(tree))


class _Jumping(VirtualClock):
    def sleep_until_blocking(self, when_ns: int) -> None:
        self._set_now(when_ns)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(CLASSIFIERS)), st.lists(trees, min_size=1, max_size=3))
@example("transient_only", [[("connection", 0)]])
@example("standard", [[("connection", 0), [("defect", 0)]]])
def test_retry_of_an_operation_raising_groups_follows_the_model(name: str, forest: list[Tree]) -> None:
    tree = forest  # the operation raises one group holding every generated tree
    leaves = flatten(tree)
    verdict, wait = group_model(name, leaves)
    if any(kind == "defect" for kind, _ in leaves):
        verdict = "stop"  # a Defect anywhere in the group is never retried, whatever the classifier
    clock = _Jumping()
    starts: list[float] = []
    raised: list[BaseException] = []

    def op() -> None:
        starts.append(clock.now())
        error = build(tree)
        raised.append(error)
        raise error

    with stoic.use_clock(clock), pytest.raises(ExceptionGroup) as caught:
        retry_sync(Schedule.fixed(1).attempts(3), op, classify=CLASSIFIERS[name], budget=RetryBudget.UNLIMITED,
                   label="groups")
    assert caught.value is raised[-1]  # the group itself, unchanged, never a wrapper
    if verdict == "stop":
        assert starts == [0.0]
    else:
        step = 1.0 if wait is None else float(min(wait, 300))
        assert starts == [0.0, step, 2 * step]


def test_a_group_with_its_own_retry_decision_decides_for_itself() -> None:
    class Pausing(ExceptionGroup):  # type: ignore[type-arg]
        retry_decision = RetryDecision.retry_after(9)

    group = Pausing("g", [TypeError()])
    for classifier in CLASSIFIERS.values():
        assert classifier(group) == RetryDecision.retry_after(9)


def test_a_classifier_you_write_receives_the_group_itself() -> None:
    seen: list[BaseException] = []
    mine = RetryClassifier(lambda error: seen.append(error) or False)
    group = ExceptionGroup("g", [ConnectionError()])
    assert mine(group) == RetryDecision.STOP
    assert seen == [group]
