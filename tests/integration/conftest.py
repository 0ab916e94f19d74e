"""The fleet tests' Redis: one real redis-server per test module (its own port and directory)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis_harness import RedisServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    running = RedisServer(tmp_path_factory.mktemp("redis"))
    yield running
    running.stop()
