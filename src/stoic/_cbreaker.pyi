"""The circuit breaker's compiled success paths (see ``stoic._native``)."""

from collections.abc import Awaitable, Callable, Generator
from contextvars import ContextVar
from types import CodeType, ModuleType
from typing import Any

class Core:
    _closed_epoch: list[None] | None
    _defer_until: int
    _now: Callable[[], int]
    _slow_ns: int
    def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any: ...
    def execute(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Execution: ...

class Execution:
    def __await__(self) -> Generator[Any, None, Any]: ...
    def send(self, value: Any, /) -> Any: ...
    def throw(self, typ: Any, val: Any = ..., tb: Any = ..., /) -> Any: ...
    def close(self) -> None: ...

class Wrapper:
    _python_wrapper: Callable[..., Any]
    wants_attempt: bool
    __code__: CodeType
    __defaults__: tuple[Any, ...] | None
    __kwdefaults__: dict[str, Any] | None
    def __init__(
        self,
        breaker: Core,
        fn: Callable[..., Any],
        python: Callable[..., Any],
        names: tuple[str, ...] | None = None,
        argcount: int = 0,
        required: tuple[bool, ...] | None = None,
        *,
        is_async: bool = False,
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

def configure(
    monotonic_ns: Callable[[], int],
    deadline_module: ModuleType,
    deadline_var: ContextVar[Any],
    registry: object,
    floor_descriptor: object,
    debug: int,
    min_level: Callable[[], int],
    refuse_coroutine: Callable[[object, object], None],
    /,
) -> None: ...
