"""Helpers for tests of the blocking (threaded) policies."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

import stoic
from stoic.testing import RecordingSink


@pytest.fixture(name="sink")
def process_wide_sink() -> Iterator[RecordingSink]:
    """Process-wide, so the events of worker threads (which start with a fresh context) reach it."""
    recording = RecordingSink()
    stoic.add_sink(recording)
    try:
        yield recording
    finally:
        stoic.remove_sink(recording)
    recording.assert_contract()


def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait (really: other threads are involved) until ``condition()`` holds, or fail."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)
