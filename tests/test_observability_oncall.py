"""The observability paths as an on-call engineer meets them: a sink that can never receive an
event must be refused when installed, not accepted and starved."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import stoic
from stoic.events import Event, _sinks


class _AsyncSink:
    level = stoic.Level.INFO

    def __init__(self) -> None:
        self.got: list[str] = []

    async def emit(self, event: Event) -> None:  # an exporter's async client, a common slip
        self.got.append(event.name)


class _GeneratorSink:
    def emit(self, event: Event) -> Iterator[None]:
        yield None


class _AsyncGeneratorSink:
    async def emit(self, event: Event) -> AsyncIterator[None]:
        yield None


@pytest.mark.parametrize("make", [_AsyncSink, _GeneratorSink, _AsyncGeneratorSink])
def test_a_sink_whose_emit_only_makes_a_coroutine_or_generator_is_refused_at_install(make: type) -> None:
    # Calling such an emit runs none of its body: every event would be dropped in silence (a
    # "coroutine was never awaited" warning at best, once), while the sink looks installed.
    with pytest.raises(TypeError, match="synchronous"):
        stoic.add_sink(make())
    with pytest.raises(TypeError, match="synchronous"), stoic.use_sinks(make()):
        pass
    assert _sinks._process.entries == ()


def test_a_plain_emit_of_any_callable_kind_is_still_accepted() -> None:
    class Bound:
        def emit(self, event: Event) -> None:
            pass

    class Static:
        @staticmethod
        def emit(event: Event) -> None:
            pass

    class Callable_:
        def __init__(self) -> None:
            self.emit = lambda event: None

    class Builtin:
        def __init__(self) -> None:
            self.emit = [].append  # no __code__: accepted as before

    for sink in (Bound(), Static(), Callable_(), Builtin()):
        stoic.add_sink(sink)
        stoic.remove_sink(sink)
