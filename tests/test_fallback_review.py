"""Hostile review of with_fallback: an operation called with arguments it does not take."""

from __future__ import annotations

from typing import Any

import pytest
from test_fallback import _policies

from stoic import with_fallback
from stoic.testing import RecordingSink, VirtualClock


async def fetch(user_id: int) -> str:
    return f"user {user_id}"


class Client:
    async def get(self, path: str) -> str:
        return path

    async def __call__(self, path: str) -> str:
        return path


_WRONG_CALLS: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = [
    ("missing", fetch, (), {}),
    ("extra", fetch, (1, 2), {}),
    ("keyword", fetch, (1,), {"region": "eu"}),
    ("method", Client().get, (), {}),
    ("callable", Client(), ("/a", "/b"), {}),
    ("lambda", lambda: fetch(1), (7,), {}),
]


@pytest.mark.parametrize("policy", ["direct", "breaker", "limiter", "bulkhead", "throttle", "retrying", "pipeline"])
@pytest.mark.parametrize(("case", "fn", "args", "kwargs"), _WRONG_CALLS, ids=[c[0] for c in _WRONG_CALLS])
async def test_an_operation_called_with_arguments_it_does_not_take_is_never_substituted(
    policy: str, case: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
    clock: VirtualClock, sink: RecordingSink,
) -> None:
    # with_fallback passes its own arguments to the operation: when they do not bind, the call
    # site is wrong, and every call would serve the substitute while the real call never runs
    # (the cached answer for ever, no error anywhere). Like a generator function or a coroutine
    # object in fn's place, it is a misuse: the TypeError propagates, should_handle unasked.
    called: list[Exception] = []
    judged: list[Exception] = []

    def everything(error: Exception) -> bool:
        judged.append(error)
        return True

    with pytest.raises(TypeError, match=r"\(\) (takes|missing|got an unexpected)"):
        await clock.run(with_fallback(_policies(clock)[policy], fn, *args, **kwargs, label="fallback",
                                      fallback=lambda e: called.append(e) or "cached", should_handle=everything))
    assert called == [] and judged == []
    assert sink.of("fallback.substituted") == []


async def test_a_wrong_call_inside_the_operation_is_its_own_failure_and_still_falls_back(clock: VirtualClock) -> None:
    async def operation() -> str:
        return await fetch()  # type: ignore[call-arg]  # the operation's own bug, deeper in

    async def same_name() -> str:
        return await operation_named_alike(1)  # a function of another name, called wrongly

    assert await with_fallback(_policies(clock)["bulkhead"], operation, label="f", fallback=lambda e: "cached") \
        == "cached"
    assert await with_fallback(_policies(clock)["bulkhead"], same_name, label="f", fallback=lambda e: "cached") \
        == "cached"


async def operation_named_alike() -> str:
    return "never"
