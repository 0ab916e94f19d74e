"""Compiled success paths of stoic's retry (see _cretry.c); loaded through stoic._native."""

from collections.abc import Callable
from typing import Any

class Function:
    """A compiled retry path that behaves like a Python function (binds, has a __dict__)."""

    wants_attempt: bool
    __wrapped__: Callable[..., Any]
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __get__(self, obj: object, cls: type | None = None) -> Any: ...

def _configure(**objects: object) -> None: ...
def _decorated(fn: Callable[..., Any], retrier: object, schedule: object, classify: object, nesting: object,
               label: str | None, site: str, clock: object, general: bool) -> Function: ...
def _compiled(kind: str, pure: Callable[..., Any]) -> Function: ...
