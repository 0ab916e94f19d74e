"""Every public annotation resolves at runtime: ``typing.get_type_hints`` (what dataclass-,
pydantic- and DI-style tools call) works on every public function, class and method."""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import stoic.fleet

PUBLIC_MODULES = ("stoic", "stoic.testing", "stoic.fleet", "stoic.events", "stoic.breaker", "stoic.control",
                  "stoic.keyed", "stoic.adaptive", "stoic.throttle")
# A policy that can take a fleet-wide digest names stoic.fleet's type, which ``import stoic``
# does not import (stoic.fleet imports asyncio): resolving those needs it passed in.
FLEET_NAMES = {"SharedLatency": stoic.fleet.SharedLatency, "SharedQuantile": stoic.fleet.SharedQuantile}


def _public_callables() -> Iterator[tuple[str, Callable[..., Any]]]:
    seen: set[int] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            found: list[tuple[str, Any]] = []
            if inspect.isclass(obj):
                found.append((f"{name}.__init__", obj.__init__))
                for attribute, value in vars(obj).items():
                    if attribute.startswith("_") and attribute != "__call__":
                        continue
                    value = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                    if inspect.isfunction(value):
                        found.append((f"{name}.{attribute}", value))
            elif inspect.isfunction(obj):
                found.append((name, obj))
            for label, fn in found:
                if inspect.isfunction(fn) and id(fn) not in seen:
                    seen.add(id(fn))
                    yield f"{module_name}:{label}", fn


CALLABLES = sorted(_public_callables(), key=lambda pair: pair[0])


def test_the_public_surface_has_callables_to_check() -> None:
    assert len(CALLABLES) > 150


@pytest.mark.parametrize(("name", "fn"), CALLABLES, ids=[name for name, _ in CALLABLES])
def test_annotations_resolve(name: str, fn: Callable[..., Any]) -> None:
    hints = typing.get_type_hints(fn, localns=FLEET_NAMES)
    assert "return" in hints or fn.__name__ == "__init__" or not fn.__annotations__


def test_only_the_fleet_digest_parameters_need_the_fleet_names() -> None:
    needing = []
    for name, fn in CALLABLES:
        try:
            typing.get_type_hints(fn)
        except NameError as error:
            needing.append((name, str(error)))
    assert {error for _, error in needing} <= {"name 'SharedLatency' is not defined"}
    assert {name.split(":")[1].split(".")[0] for name, _ in needing} <= {"AdaptiveBulkhead", "Hedge", "hedge"}


def test_durations_are_a_runtime_union() -> None:
    from datetime import timedelta

    from stoic._durations import Seconds

    assert typing.get_args(Seconds) == (float, int, timedelta)
