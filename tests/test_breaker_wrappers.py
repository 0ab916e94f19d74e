"""The ``@breaker`` wrappers: generated with the wrapped function's own parameters when they are
simple, with ``(*args, **kwargs)`` otherwise; both forward every argument exactly, keep the
function's metadata and take the closed-state fast path."""

from __future__ import annotations

import functools
import inspect
import traceback
from typing import Any

import pytest
from _breaker_helpers import Boom, StepClock

from stoic import CircuitBreaker, CountWindow

SENTINEL = object()


def _breaker() -> CircuitBreaker:
    # minimum_calls=1: from the second call on a quick success takes the fast path.
    return CircuitBreaker(label="w", window=CountWindow(10), minimum_calls=1, clock=StepClock())  # type: ignore[arg-type]


def _python(wrapper: Any) -> Any:
    """The generated Python wrapper (the compiled wrapper of a plain function keeps it for the
    calls whose arguments it cannot prove to bind)."""
    return getattr(wrapper, "_python_wrapper", wrapper)


def _mirrors(wrapper: Any) -> bool:
    """Whether the wrapper was generated with the function's own parameters."""
    return "*stoic_args" not in _python(wrapper).__code__.co_filename


def test_simple_parameters_are_mirrored_with_their_defaults() -> None:
    breaker = _breaker()

    def original(a: int, b: object = SENTINEL, *, c: list[int] | None = None, d: int) -> tuple[Any, ...]:
        """Doc."""
        return a, b, c, d

    f = breaker(original)
    assert _mirrors(f)
    assert f(1, d=4) == (1, SENTINEL, None, 4)  # the very default objects
    assert f(1, 2, c=[3], d=4) == (1, 2, [3], 4)
    assert f(d=4, a=1, b=2) == (1, 2, None, 4)  # positional parameters passed by name
    assert f.__name__ == "original" and f.__doc__ == "Doc." and f.__wrapped__ is original  # type: ignore[attr-defined]
    assert f.__qualname__ == original.__qualname__ and f.__annotations__ == original.__annotations__
    assert f.__module__ == __name__
    assert str(inspect.signature(f)) == (
        "(a: 'int', b: 'object' = <object>, *, c: 'list[int] | None' = None, d: 'int') -> 'tuple[Any, ...]'"
    ).replace("<object>", repr(SENTINEL))
    assert not inspect.iscoroutinefunction(f)


def test_mirrored_defaults_are_not_shared_mutably_with_the_function() -> None:
    breaker = _breaker()

    def f(*, k: int = 1) -> int:
        return k

    wrapped = breaker(f)
    assert _python(wrapped).__kwdefaults__ == {"k": 1}
    assert _python(wrapped).__kwdefaults__ is not f.__kwdefaults__
    assert wrapped() == 1


def test_parameters_named_like_the_wrapper_internals_are_forwarded() -> None:
    breaker = _breaker()

    @breaker
    def f(fn: int, start: int, end: int, epoch: int, result: int, now: int, breaker: int) -> int:
        return fn + start + end + epoch + result + now + breaker

    assert _mirrors(f)
    assert f(1, 2, 3, 4, 5, 6, 7) == 28
    assert f(fn=1, start=2, end=3, epoch=4, result=5, now=6, breaker=7) == 28


@pytest.mark.parametrize(
    "shape", ["varargs", "varkw", "posonly", "prefixed", "builtin", "partial", "method", "object"]
)
def test_other_shapes_get_the_packed_wrapper_and_forward_exactly(shape: str) -> None:
    breaker = _breaker()

    def varargs(a: int, *rest: int) -> Any:
        return (a, rest)

    def varkw(a: int, **kw: int) -> Any:
        return (a, kw)

    def posonly(a: int, /, b: int = 2) -> Any:
        return (a, b)

    def prefixed(stoic_a: int, b: int = 2) -> Any:
        return (stoic_a, b)

    def builtin(BaseException: int) -> Any:  # shadows the builtin the wrapper reads
        return BaseException

    class Thing:
        def method(self, a: int, b: int = 2) -> Any:
            return (a, b)

        def __call__(self, a: int, b: int = 2) -> Any:
            return (a, b)

    fns: dict[str, Any] = {
        "varargs": (varargs, ((1, 2, 3), {}), (1, (2, 3))),
        "varkw": (varkw, ((1,), {"x": 2}), (1, {"x": 2})),
        "posonly": (posonly, ((1,), {"b": 3}), (1, 3)),
        "prefixed": (prefixed, ((), {"stoic_a": 1}), (1, 2)),
        "builtin": (builtin, ((7,), {}), 7),
        "partial": (functools.partial(posonly, 1), ((), {"b": 5}), (1, 5)),
        "method": (Thing().method, ((1,), {}), (1, 2)),
        "object": (Thing(), ((1, 3), {}), (1, 3)),
    }
    fn, (args, kwargs), expected = fns[shape]
    wrapped = breaker(fn)
    assert not _mirrors(wrapped)
    for _ in range(3):
        assert wrapped(*args, **kwargs) == expected
    assert breaker.snapshot.calls == 3


def test_a_decorated_method_receives_self() -> None:
    breaker = _breaker()

    class Client:
        def __init__(self) -> None:
            self.base = 10

        @breaker
        def get(self, n: int) -> int:
            return self.base + n

    client = Client()
    assert client.get(1) == 11 and client.get(n=2) == 12
    assert breaker.snapshot.calls == 2


@pytest.mark.parametrize("mirrored", [True, False])
def test_both_wrappers_take_the_fast_path_and_record_failures(mirrored: bool) -> None:
    breaker = _breaker()

    def op(fail: bool = False) -> str:
        if fail:
            raise Boom("down")
        return "ok"

    def packed(*args: bool) -> str:
        return op(*args)

    wrapped = breaker(op if mirrored else packed)
    assert _mirrors(wrapped) is mirrored
    for _ in range(5):
        assert wrapped() == "ok"
    assert breaker._pending_quick() == 4  # the first one reached minimum_calls under the lock
    with pytest.raises(Boom):
        wrapped(True)
    snap = breaker.snapshot
    assert (snap.calls, snap.failures) == (6, 1)


@pytest.mark.parametrize("mirrored", [True, False])
async def test_async_wrappers_mirror_or_pack_and_take_the_fast_path(mirrored: bool) -> None:
    breaker = _breaker()

    async def op(a: int, *, b: int = 2) -> int:
        return a + b

    async def packed(*args: int, **kwargs: int) -> int:
        return await op(*args, **kwargs)

    wrapped = breaker(op if mirrored else packed)
    assert _mirrors(wrapped) is mirrored
    assert inspect.iscoroutinefunction(wrapped)
    for _ in range(5):
        assert await wrapped(1, b=3) == 4
    assert await wrapped(1) == 3
    assert breaker._pending_quick() == 5
    assert breaker.snapshot.calls == 6


def test_arguments_a_mirrored_wrapper_cannot_bind_raise_before_the_breaker_sees_the_call() -> None:
    # Like calling the function itself: a TypeError for arguments it cannot take is a bug at
    # the call site, raised by the wrapper before admission, and is never counted.
    breaker = _breaker()

    @breaker
    def f(a: int) -> int:
        return a

    with pytest.raises(TypeError, match=r"f\(\) missing 1 required positional argument: 'a'"):
        f()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        f(1, z=2)  # type: ignore[call-arg]
    assert breaker.snapshot.calls == 0


def test_tracebacks_through_the_wrapper_show_its_source() -> None:
    breaker = _breaker()

    @breaker
    def f(a: int) -> int:
        raise Boom(str(a))

    with pytest.raises(Boom) as caught:
        f(1)
    text = "".join(traceback.format_exception(caught.value))
    assert "raise Boom(str(a))" in text
    assert "stoic_result = stoic_fn(a)" in text
