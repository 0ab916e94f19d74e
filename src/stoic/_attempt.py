"""Attempt: what a retried or hedged operation is told about the try it is running."""

from __future__ import annotations

import uuid


class Attempt:
    """One try of an operation under ``retry`` or ``hedge``.

    ``number`` counts from 1 (the first attempt). ``call_id`` is the same for every attempt of
    one logical call and unique across calls: send it as an idempotency key so the server can
    recognise a repeat. ``hedged`` is true for an attempt started by ``hedge`` beside a running
    one (send it as a "hedged request" header if your server distinguishes them).

    Immutable. ``call_id`` is generated on first use (a random UUID, hex), so an operation that
    never reads it pays nothing for it.
    """

    __slots__ = ("_call_id", "hedged", "number")

    number: int
    hedged: bool
    _call_id: str | None

    def __init__(self, number: int, call_id: str | None = None, hedged: bool = False) -> None:
        object.__setattr__(self, "number", number)
        object.__setattr__(self, "_call_id", call_id)
        object.__setattr__(self, "hedged", hedged)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Attempt is immutable")

    # A value: copies are itself (sharing the id, drawn or not), and pickle sends a plain
    # Attempt with the call's id drawn now, so both sides of a process boundary send the same.
    def __reduce__(self) -> tuple[type[Attempt], tuple[int, str, bool]]:
        return Attempt, (self.number, self.call_id, self.hedged)

    def __copy__(self) -> Attempt:
        return self

    def __deepcopy__(self, memo: object) -> Attempt:
        return self

    @property
    def call_id(self) -> str:
        """The id shared by every attempt of this call (a UUID4 in hex)."""
        call_id = self._call_id
        if call_id is None:
            call_id = uuid.uuid4().hex
            object.__setattr__(self, "_call_id", call_id)
        return call_id

    @property
    def idempotency_key(self) -> str:
        """The key to send for idempotency: the call's id (shared by all its attempts)."""
        return self.call_id

    @property
    def is_first(self) -> bool:
        return self.number == 1

    def next(self) -> Attempt:
        """The following attempt of the same call (same ``call_id``)."""
        return Attempt(self.number + 1, self.call_id, self.hedged)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Attempt):
            return NotImplemented
        return (self.number, self.call_id, self.hedged) == (other.number, other.call_id, other.hedged)

    def __hash__(self) -> int:
        return hash((self.number, self.call_id, self.hedged))

    def __repr__(self) -> str:
        return f"Attempt(number={self.number}, call_id={self.call_id!r}, hedged={self.hedged})"


class _First(Attempt):
    """Attempt 1 of a retried call: built by setting one slot (its number and flag are the
    class's, the same for every first attempt), on the path of every call that wants one."""

    __slots__ = ()

    number = 1
    hedged = False


_new_object = object.__new__
_set_call_id = Attempt.__dict__["_call_id"].__set__


def first_attempt() -> Attempt:
    """``Attempt(1)``, without ``Attempt.__init__``."""
    attempt = _new_object(_First)
    _set_call_id(attempt, None)
    return attempt
