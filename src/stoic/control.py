"""The control plane: look at and steer live policies by name (seed 003, "Control plane").

A :class:`ControlPlane` is a registry of policies by name: plain policy objects and
:class:`stoic.Keyed` families (state per ``(policy, key)``, the seed's ``(policy, route)``).
:meth:`ControlPlane.inspect` reads :class:`PolicyState` snapshots; :meth:`~ControlPlane.force_open`
/ :meth:`~ControlPlane.clear_forced_open` are the manual kill switch; :meth:`~ControlPlane.retune`
swaps a policy's (or a family's) configuration live. Every control action is an event (``control.*``) carrying
the optional ``actor`` the caller names (who asked: an operator, a ticket).

Policies are read by duck typing, so any policy with these properties fits (the adaptive
bulkheads and the throttle among them): ``state`` (a breaker), ``available_permits`` /
``waiter_count`` (a limiter), ``limit`` or ``max_concurrent``, ``in_use`` or ``active_count``,
``queued`` or ``queued_count`` (a bulkhead), ``current_delay`` (a hedge), ``probability``
(a throttle).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from ._clock import Clock, check_clock, current_clock
from ._durations import check_label
from ._metrics import encodable
from .events import Level, emit
from .events._sinks import kind_floor
from .keyed import Keyed, _switch, is_forced_open

# The sinks wanting control events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("control")

__all__ = ["ControlPlane", "PolicyState", "UnknownPolicy"]

T = TypeVar("T")


class UnknownPolicy(LookupError):
    """A control call named a policy (or a key of a family) that is not registered."""


@dataclass(frozen=True, slots=True)
class PolicyState:
    """One policy's state at an instant, for one ``(policy, key)``; fields that do not apply
    to the policy's kind are ``None``.

    ``policy`` (the registered name), ``key`` (``None`` for a plain policy or a family's
    unkeyed one), ``label``, ``kind`` (the class name); a breaker's ``state`` and
    ``forced_open``, ``retry_after`` (seconds left open; ``None`` when forced or not open);
    a limiter's ``available_permits`` and ``waiters``; a bulkhead's ``limit``, ``in_use`` and
    ``queued``; a hedge's ``hedge_delay`` (seconds); a throttle's ``probability``.
    """

    policy: str
    key: str | None
    label: str
    kind: str
    state: str | None = None
    forced_open: bool | None = None
    retry_after: float | None = None
    available_permits: int | None = None
    waiters: int | None = None
    limit: int | None = None
    in_use: int | None = None
    queued: int | None = None
    hedge_delay: float | None = None
    probability: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields that apply (JSON-ready: str, int, float, bool)."""
        return {k: v for k, v in asdict(self).items() if v is not None or k == "key"}


def _read(policy: object, *names: str) -> Any:
    for name in names:
        value = getattr(policy, name, None)
        if value is not None and not callable(value):
            return value
    return None


def read_state(name: str, key: str | None, policy: object) -> PolicyState:
    """A :class:`PolicyState` of ``policy`` read now (by duck typing, see the module docstring)."""
    state = getattr(policy, "state", None)
    breaker = state is not None and callable(getattr(policy, "force_open", None))
    retry_after: float | None = None
    if breaker:
        snap = getattr(policy, "snapshot", None)
        if callable(snap) and not hasattr(snap, "state"):
            snap = snap()
        retry_after = getattr(snap, "retry_after", None)
    label = getattr(policy, "label", None)
    return PolicyState(
        policy=name,
        key=key,
        label=label if isinstance(label, str) else name,
        kind=type(policy).__name__,
        state=str(state) if state is not None else None,
        forced_open=is_forced_open(policy) if breaker else None,
        retry_after=retry_after,
        available_permits=_read(policy, "available_permits", "permits"),
        waiters=_read(policy, "waiter_count", "waiters"),
        limit=_read(policy, "limit", "max_concurrent"),
        in_use=_read(policy, "in_use", "active_count"),
        queued=_read(policy, "queued", "queued_count"),
        hedge_delay=_read(policy, "current_delay", "hedge_delay"),
        probability=_read(policy, "probability"),
    )


class ControlPlane:
    """Policies registered by name, and the controls an operator needs during an incident.

    ``ControlPlane(clock=None)``; ``clock`` stamps the ``control.*`` events (default: the
    ambient clock at construction; ``TypeError`` naming ``clock`` for an object that is not
    one). Thread-safe. A typical service has one, shared by its
    HTTP integrations and served by :func:`stoic.admin.admin_app`.
    """

    __slots__ = ("_clock", "_entries", "_lock")

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock: Clock = check_clock(clock) if clock is not None else current_clock()
        self._entries: dict[str, object] = {}
        self._lock = threading.Lock()

    def register(self, policy: T, *, name: str | None = None) -> T:
        """Register ``policy`` (a policy object or a :class:`stoic.Keyed` family) under ``name``
        (default: its ``label``); returns ``policy``. Raises ``ValueError`` when the name is
        taken by another policy, ``TypeError`` when no name is given and it has no str label."""
        name = check_label(name if name is not None else getattr(policy, "label", None))
        with self._lock:
            held = self._entries.get(name)
            if held is not None and held is not policy:
                raise ValueError(f"a policy named {name!r} is registered already")
            self._entries[name] = policy
        return policy

    def unregister(self, name: str) -> None:
        """Forget ``name``; raises :class:`UnknownPolicy` when it is not registered."""
        with self._lock:
            if self._entries.pop(name, None) is None:
                raise UnknownPolicy(f"no policy named {name!r}")

    @property
    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        with self._lock:
            return tuple(self._entries)

    def get(self, name: str) -> Any:
        """The policy or family registered as ``name`` (:class:`UnknownPolicy` otherwise)."""
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            raise UnknownPolicy(f"no policy named {name!r}")
        return entry

    def _members(self, name: str, entry: object) -> Iterator[tuple[str | None, object]]:
        if isinstance(entry, Keyed):
            yield from entry.policies.items()
        else:
            yield None, entry

    def inspect(self, policy: str | None = None) -> list[PolicyState]:
        """Snapshots per ``(policy, key)``: of every registered policy, or of ``policy`` alone
        (:class:`UnknownPolicy` when it is not registered). Reading applies a breaker's due
        lazy transitions, as reading its state does."""
        if policy is None:
            with self._lock:
                entries = list(self._entries.items())
        else:
            entries = [(policy, self.get(policy))]
        return [read_state(name, key, member) for name, entry in entries for key, member in
                self._members(name, entry)]

    def force_open(self, policy: str, key: str | None = None, *, actor: str | None = None) -> int:
        """Trip the breaker ``policy`` open with no end (for a family: ``key``'s, or with no key
        every key's, including keys built later until cleared). Returns how many breakers
        were forced. Raises :class:`UnknownPolicy` for an unknown policy or key, ``TypeError``
        when the policy is not a breaker, or is one whose ``force_open`` is a coroutine (a
        :class:`stoic.fleet.SharedCircuitBreaker`: ``await breaker.force_open()`` on it), and then
        nothing changed. Emits ``control.forced_open``."""
        entry = self.get(policy)
        if isinstance(entry, Keyed):
            count = self._on_key(entry, policy, key, entry.force_open)
        else:
            self._no_key(policy, key)
            _switch(entry, "force_open", policy, plain=True)()
            count = 1
        self._emit("control.forced_open", policy, key, actor, {"policies": count})
        return count

    def clear_forced_open(self, policy: str, key: str | None = None, *, actor: str | None = None) -> int:
        """Lift a manual trip (``key``'s, or with no key every key's): a forced-open breaker
        closes with an empty window; a breaker that opened by itself is left to its own
        schedule. Returns how many were cleared. Errors as :meth:`force_open`. Emits
        ``control.cleared``."""
        entry = self.get(policy)
        if isinstance(entry, Keyed):
            count = self._on_key(entry, policy, key, entry.clear_forced_open)
        else:
            self._no_key(policy, key)
            _switch(entry, "force_open", policy, plain=True)
            close = _switch(entry, "force_closed", policy, plain=True)
            count = 0
            if is_forced_open(entry):
                close()
                count = 1
        self._emit("control.cleared", policy, key, actor, {"policies": count})
        return count

    def retune(self, policy: str, /, *, actor: str | None = None, **changes: Any) -> int:
        """Swap ``policy``'s configuration live, validated like the constructor, all or nothing.

        A plain policy (:class:`stoic.CircuitBreaker`, :class:`stoic.RateLimiter`,
        :class:`stoic.Bulkhead`, the adaptive bulkheads, :class:`stoic.AdaptiveThrottle`,
        :class:`stoic.Hedge` and their blocking twins) is retuned in place by its own
        ``_retune``: calls in flight keep their slots, permits and probes, and what it learnt
        under the old configuration (windows, estimates, adaptive limits) is dropped (see each
        kind's ``_retune``). A :class:`stoic.Keyed` family rebuilds every key's policy
        (:meth:`stoic.Keyed.retune`). Returns how many policies were retuned.

        Raises :class:`UnknownPolicy`; ``ValueError`` naming the parameter for a value out of
        range (or none given) and ``TypeError`` for a parameter the policy does not take (``label``
        and ``clock`` included), leaving the live policy unchanged; ``TypeError`` when the policy
        cannot be retuned. Emits ``control.retuned``. (``policy`` is positional: a change
        named ``policy`` is the policy's parameter, refused as the others are; ``actor`` is this
        call's own.)"""
        entry = self.get(policy)
        if not changes:
            raise ValueError("retune needs at least one parameter to change")
        if isinstance(entry, Keyed):
            count = entry.retune(**changes)
        else:
            retune = getattr(entry, "_retune", None)
            if not callable(retune):
                raise TypeError(f"{policy!r} is a {type(entry).__name__}, which cannot be retuned")
            retune(**changes)
            count = 1
        self._emit("control.retuned", policy, None, actor,
                   {"policies": count, "parameters": ",".join(sorted(changes))})
        return count

    @staticmethod
    def _on_key(entry: Keyed[Any], policy: str, key: str | None, action: Any) -> int:
        try:
            count: int = action(key)
        except LookupError:
            raise UnknownPolicy(f"{policy!r} holds no key {key!r}") from None
        return count

    @staticmethod
    def _no_key(policy: str, key: str | None) -> None:
        if key is not None:
            raise UnknownPolicy(f"{policy!r} is not keyed: no key {key!r}")

    def _emit(self, name: str, policy: str, key: str | None, actor: str | None, attrs: dict[str, Any]) -> None:
        level = Level.WARNING if name == "control.forced_open" else Level.INFO
        if _SINKS.wants(level):
            # (both come from an operator's request: sent as every exposition can encode them)
            if key is not None:
                attrs["key"] = encodable(key)
            if actor is not None:
                attrs["actor"] = encodable(str(actor))
            emit(name, policy, level, self._clock.now_ns(), attrs)

    def __repr__(self) -> str:
        return f"ControlPlane({', '.join(self.names)})"
