"""Attempt: what a retried or hedged operation is told about the try it is running."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


def _new_call_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of an operation under ``retry`` or ``hedge``.

    ``number`` counts from 1 (the first attempt). ``call_id`` is the same for every attempt of
    one logical call and unique across calls: send it as an idempotency key so the server can
    recognise a repeat. ``hedged`` is true for an attempt started by ``hedge`` beside a running
    one (send it as a "hedged request" header if your server distinguishes them).
    """

    number: int
    call_id: str = field(default_factory=_new_call_id)
    hedged: bool = False

    @property
    def idempotency_key(self) -> str:
        """The key to send for idempotency: the call's id (shared by all its attempts)."""
        return self.call_id

    @property
    def is_first(self) -> bool:
        return self.number == 1
