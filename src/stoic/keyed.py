"""Keyed policies: one policy per key (host, route, tenant), built on first use (seed 003,
"Control plane": state is kept per ``(policy, route)``).

A :class:`Keyed` family holds one configuration and a factory (``CircuitBreaker``,
``RateLimiter``, ``Bulkhead``, an adaptive bulkhead, or any callable taking ``label=`` and
``clock=``). Memory is bounded twice over:

- at most ``max_keys`` policies are held; a key unused for ``idle_after`` seconds is dropped
  when the family next makes room, and at capacity the least recently used key that is *at
  rest* goes first. A policy is at rest when nothing would be lost by forgetting it: no call
  in flight through the family, a breaker that is closed (never open, half-open or forced),
  a bulkhead or limiter with nothing running or queued, a limiter whose bucket is full again,
  an adaptive throttle whose shed probability is 0 (a per-key ``Pipeline``: every stage at
  rest). When every key is busy, a new key is served by one shared overflow policy instead
  (``keyed.full``), so a flood of new keys can neither grow memory nor evict a breaker (or a
  throttle) that is protecting a failing dependency.
- labels: each key's policy is labelled ``f"{label}:{key}"`` for the first ``max_labels``
  distinct keys; later keys get ``f"{label}:{OVERFLOW_KEY}"``, so a route with IDs in it
  cannot explode the cardinality of the metrics (``stoic.label``).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final, Generic, TypeVar

from ._clock import Clock, SystemClock, current_clock
from ._durations import Seconds, check_int, check_label, to_ns
from ._metrics import encodable
from ._random import building_for, call_site
from .events import Level, emit
from .events._sinks import kind_floor

# The sinks wanting keyed events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("keyed")

__all__ = ["OVERFLOW_KEY", "Keyed"]

P = TypeVar("P")
R = TypeVar("R")

OVERFLOW_KEY: Final = "_other"
"""The key part of the label shared by keys past ``max_labels`` (and of the overflow policy)."""

# Duck-typed readings that say a policy holds work: a bulkhead's slots and queue, a limiter's
# waiters (the names of today's policies and of the adaptive ones).
_BUSY_COUNTS: Final = ("in_use", "active_count", "queued", "queued_count", "waiters", "waiter_count")


def at_rest(policy: object) -> bool:
    """Whether forgetting ``policy`` loses nothing: a breaker that is closed, no slot taken,
    nothing queued, a limiter's bucket full, a throttle shedding nothing. A
    :class:`stoic.Pipeline` (a factory building one per key) has no state of its own: it is at
    rest when every stage is. Any reading that fails counts as busy (never
    evict on doubt)."""
    try:
        stages = getattr(policy, "stages", None)
        if isinstance(stages, tuple):
            return all(at_rest(stage) for stage in stages)
        state = getattr(policy, "state", None)
        if state is not None and str(state) != "closed":
            return False
        for name in _BUSY_COUNTS:
            value = getattr(policy, name, 0)
            if isinstance(value, int) and value > 0:
                return False
        # A limiter short of a full bucket: forgetting it would hand the key's next call the
        # permits it has spent (a quota of one an hour given again after idle_after).
        burst = getattr(policy, "burst", None)
        if isinstance(burst, int) and getattr(policy, "available_permits", burst) < burst:
            return False
        # A throttle still shedding: forgetting it would send the key's failing dependency every
        # call until a fresh window fills (its probability decays to 0 within a window unused).
        probability = getattr(policy, "probability", 0.0)
        if isinstance(probability, float) and probability > 0.0:
            return False
    except Exception:
        return False
    return True


def is_forced_open(policy: object) -> bool:
    """Whether ``policy`` is a breaker forced open (open with no end: ``retry_after`` None)."""
    if str(getattr(policy, "state", "")) != "open":
        return False
    snap = getattr(policy, "snapshot", None)
    if callable(snap) and not hasattr(snap, "state"):
        snap = snap()  # snapshot as a method (today) or as a property
    return snap is not None and getattr(snap, "retry_after", 0.0) is None


class _Slot(Generic[P]):
    """One key's policy. ``calls`` holds one entry per call in flight through the family: a
    list, because ``append`` and ``pop`` are single operations under the GIL, so a call is
    counted in and out without the family's lock (:meth:`Keyed._claim`)."""

    __slots__ = ("calls", "label", "last_used", "policy")

    def __init__(self, policy: P, label: str, now: int) -> None:
        self.policy = policy
        self.label = label
        self.last_used = now
        self.calls: list[None] = []

    @property
    def inflight(self) -> int:
        return len(self.calls)


class Keyed(Generic[P]):
    """A family of policies, one per key, all built from one configuration.

    ``Keyed(factory, *, label, max_keys=1024, idle_after=600.0, max_labels=100, clock=None,
    **config)``: each policy is ``factory(label=<key label>, clock=clock, **config)``. The
    configuration is validated at construction by building one policy (so the factory's
    ``ValueError``/``TypeError`` naming a parameter is raised here, not on first use).

    - ``label`` (non-empty str): the family's name; key ``k`` is labelled ``f"{label}:{k}"``
      (the first ``max_labels`` distinct keys; later ones share ``f"{label}:_other"``). The
      key ``None`` is the family's unkeyed policy, labelled ``label`` itself.
    - ``max_keys`` (>= 1, default 1024): policies held at most. ``idle_after`` (> 0 seconds,
      default 600): a key unused this long is dropped when room is needed. Idle ages and the
      least-recently-used order are kept to 1 % of ``idle_after`` (at most 1 s): a use that
      soon after the key was last stamped leaves it as it is, so a hit takes no lock.
    - ``max_labels`` (>= 1, default 100): distinct labels this family puts on events and metrics.
    - ``clock``: measures idleness and is passed to every policy (default: the ambient clock).

    :meth:`get` returns the key's policy; :meth:`execute` / :meth:`call` run through it and
    count the call as in flight (a key with a call in flight is never dropped). Raises
    ``TypeError`` for a key that is not a ``str`` (or None).
    """

    __slots__ = ("_clock", "_config", "_factory", "_forced_all", "_full", "_idle_ns", "_label", "_labelled",
                 "_lock", "_max_keys", "_max_labels", "_now", "_overflow", "_site", "_slots",
                 "_stoic_class", "_touch_ns")

    def __init__(
        self,
        factory: Callable[..., P],
        /,
        *,
        label: str,
        max_keys: int = 1024,
        idle_after: Seconds = 600.0,
        max_labels: int = 100,
        clock: Clock | None = None,
        **config: Any,
    ) -> None:
        if not callable(factory):
            raise TypeError(f"factory must be callable (a policy class), got {type(factory).__name__}")
        self._label = check_label(label)
        self._max_keys = check_int(max_keys, "max_keys", minimum=1)
        self._idle_ns = to_ns(idle_after, "idle_after")
        self._touch_ns = min(self._idle_ns // 100, 1_000_000_000)
        self._max_labels = check_int(max_labels, "max_labels", minimum=1)
        self._clock: Clock = clock if clock is not None else current_clock()
        if not callable(getattr(self._clock, "now_ns", None)):
            raise TypeError(f"clock must be a stoic.Clock (with now_ns), got {type(clock).__name__}")
        # The lock-free hits' clock read: the system clock's own function saves a Python frame.
        self._now: Callable[[], int] = (time.monotonic_ns if type(self._clock) is SystemClock
                                        else self._clock.now_ns)
        self._factory = factory
        self._site = call_site(1)  # what is per call site in its policies (a hedge's budget) is this line's
        self._stoic_class = isinstance(factory, type) and factory.__module__.partition(".")[0] == "stoic"
        _check_parameters(factory, config)
        factory(label=self._label, clock=self._clock, **config)  # validates the configuration
        self._config: dict[str, Any] = dict(config)
        self._lock = threading.Lock()
        self._slots: OrderedDict[str | None, _Slot[P]] = OrderedDict()
        self._labelled: set[str] = set()
        self._overflow: _Slot[P] | None = None
        self._forced_all = False
        self._full = False

    # ------------------------------------------------------------------ reading
    @property
    def label(self) -> str:
        return self._label

    @property
    def factory(self) -> Callable[..., P]:
        return self._factory

    @property
    def config(self) -> Mapping[str, Any]:
        """The configuration every policy of the family is built from (read-only)."""
        return MappingProxyType(dict(self._config))

    @property
    def max_keys(self) -> int:
        return self._max_keys

    @property
    def policies(self) -> dict[str | None, P]:
        """A copy of the policies held now, by key (the overflow policy under ``OVERFLOW_KEY``,
        unless a real key of that name is held: it comes first, as for the control actions)."""
        with self._lock:
            held: dict[str | None, P] = {key: slot.policy for key, slot in self._slots.items()}
            if self._overflow is not None:
                held.setdefault(OVERFLOW_KEY, self._overflow.policy)
        return held

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: object) -> bool:
        return key in self._slots

    def __iter__(self) -> Iterator[str | None]:
        return iter(list(self._slots))

    def label_for(self, key: str | None) -> str:
        """The label key ``key`` has (or would get now)."""
        _check_key(key)
        with self._lock:
            return self._label_locked(key, reserve=False)

    # ------------------------------------------------------------------ getting a key's policy
    def get(self, key: str | None = None) -> P:
        """The policy of ``key``, built on first use (see the class docstring for bounds)."""
        # A hit touched within the last _touch_ns is returned without the lock: the LRU order and
        # idle ages are kept to that precision (1 % of idle_after, at most 1 s), and the request
        # path takes no lock. A miss, a stale stamp or a key of another type goes to _slot.
        slot = self._slots.get(key) if key is None or type(key) is str else None
        if slot is not None and self._now() - slot.last_used < self._touch_ns:
            return slot.policy
        return self._slot(key).policy

    def _slot(self, key: str | None, claim: bool = False) -> _Slot[P]:
        """The key's slot, made on a miss; ``claim`` counts a call in flight in the same critical
        section, so no other thread can drop the key between finding it and using it."""
        _check_key(key)
        now = self._clock.now_ns()
        events: list[tuple[str, Level, dict[str, Any]]] = []
        try:
            with self._lock:
                slot = self._slots.get(key)
                if slot is not None:
                    slot.last_used = now
                    self._slots.move_to_end(key)
                    if claim:
                        slot.calls.append(None)
                    return slot
                self._expire(now, events)
                if len(self._slots) >= self._max_keys and not self._evict_lru(events):
                    slot = self._overflow_slot(now, events)
                else:
                    slot = _Slot(self._build(self._label_locked(key, reserve=True)), "", now)
                    slot.label = self._label_locked(key, reserve=False)
                    self._slots[key] = slot
                    self._full = False
                if claim:
                    slot.calls.append(None)
        except BaseException:
            # The factory failed (a factory of one's own may): the keys dropped to make room are
            # gone all the same, and their events say so.
            self._emit(events, now)
            raise
        if events:
            try:
                self._emit(events, now)
            except BaseException:
                # A sink's BaseException (a sink's Exception is skipped by emit): the call
                # counted in flight will not run, so it is counted out before that propagates.
                if claim:
                    slot.calls.pop()
                raise
        return slot

    def _label_locked(self, key: str | None, *, reserve: bool) -> str:
        # A key is data (a tenant id from a request body): it goes on labels and events as every
        # exposition can encode it (a lone surrogate as U+FFFD, stoic._metrics.encodable).
        if key is None:
            return self._label
        if key in self._labelled:
            return f"{self._label}:{encodable(key)}"
        if len(self._labelled) < self._max_labels:
            if reserve:
                self._labelled.add(key)
            return f"{self._label}:{encodable(key)}"
        return f"{self._label}:{OVERFLOW_KEY}"

    def _build(self, label: str) -> P:
        # One of stoic's classes is constructed here, inside stoic: it is told the family's line
        # instead. (A factory of one's own constructs its policies on lines of its own.)
        token = building_for.set(self._site) if self._stoic_class else None
        try:
            policy = self._factory(label=label, clock=self._clock, **self._config)
        finally:
            if token is not None:
                building_for.reset(token)
        if self._forced_all:
            _force(policy, self._label)
        return policy

    def _overflow_slot(self, now: int, events: list[tuple[str, Level, dict[str, Any]]]) -> _Slot[P]:
        if self._overflow is None:
            label = f"{self._label}:{OVERFLOW_KEY}"
            self._overflow = _Slot(self._build(label), label, now)
        if not self._full:
            self._full = True
            events.append(("keyed.full", Level.WARNING, {"keys": len(self._slots)}))
        self._overflow.last_used = now
        return self._overflow

    @staticmethod
    def _at_rest(slot: _Slot[P]) -> bool:
        """Whether the slot's policy is at rest. A slot is dropped only when this holds and then
        ``not slot.calls``, tested in that order and right before the ``del``: a lock-free claim
        (:meth:`_claim`) counts its call in without the lock, and CPython may switch threads when
        a call returns (this one), never between a plain test and the ``del`` after it. Testing
        the count first let a claim land in between and its key be dropped in flight."""
        return at_rest(slot.policy)

    def _expire(self, now: int, events: list[tuple[str, Level, dict[str, Any]]]) -> None:
        """Drop keys idle for ``idle_after`` and at rest, oldest first (under the lock)."""
        cutoff = now - self._idle_ns
        for key in list(self._slots):
            slot = self._slots[key]
            if slot.last_used > cutoff:
                break  # least recently used first: the rest are younger
            if self._at_rest(slot) and not slot.calls:
                del self._slots[key]
                events.append(("keyed.evicted", Level.INFO, _key_attrs(key, "idle")))

    def _evict_lru(self, events: list[tuple[str, Level, dict[str, Any]]]) -> bool:
        for key, slot in self._slots.items():
            if self._at_rest(slot) and not slot.calls:
                del self._slots[key]
                events.append(("keyed.evicted", Level.INFO, _key_attrs(key, "capacity")))
                return True
        return False

    def sweep(self) -> int:
        """Drop every key idle for ``idle_after`` and at rest now; returns how many were dropped."""
        now = self._clock.now_ns()
        events: list[tuple[str, Level, dict[str, Any]]] = []
        with self._lock:
            cutoff = now - self._idle_ns
            for key, slot in list(self._slots.items()):
                if slot.last_used <= cutoff and self._at_rest(slot) and not slot.calls:
                    del self._slots[key]
                    events.append(("keyed.evicted", Level.INFO, _key_attrs(key, "idle")))
            if self._overflow is not None and self._overflow.last_used <= cutoff \
                    and self._at_rest(self._overflow) and not self._overflow.calls:
                self._overflow = None
        self._emit(events, now)
        return len(events)

    def _emit(self, events: list[tuple[str, Level, dict[str, Any]]], now: int) -> None:
        if events:
            level = _SINKS.level()
            for name, lvl, attrs in events:
                if level <= lvl:
                    emit(name, self._label, lvl, now, attrs)

    # ------------------------------------------------------------------ running through a key
    async def execute(self, key: str | None, fn: Callable[..., Awaitable[R]], /, *args: Any, **kwargs: Any) -> R:
        """``await family.execute(key, fn, ...)``: the key's ``policy.execute(fn, ...)``, with the
        call counted in flight (the key is not dropped meanwhile). Raises what the policy raises."""
        slot = self._claim(key)
        try:
            result: R = await slot.policy.execute(fn, *args, **kwargs)  # type: ignore[attr-defined]
            return result
        finally:
            self._unclaim(key, slot)

    def call(self, key: str | None, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """``family.call(key, fn, ...)``: the key's ``policy.call(fn, ...)`` (plain functions, for
        policies with a ``call`` method), counted in flight as :meth:`execute` does."""
        slot = self._claim(key)
        try:
            result: R = slot.policy.call(fn, *args, **kwargs)  # type: ignore[attr-defined]
            return result
        finally:
            self._unclaim(key, slot)

    def _release(self, key: str | None, slot: _Slot[P]) -> None:
        """A call through ``slot`` ended: no longer in flight, and the key is the most recently
        used (its stamp and its place in the order agree, which expiry and eviction rely on)."""
        with self._lock:
            slot.calls.pop()
            slot.last_used = self._clock.now_ns()
            if self._slots.get(key) is slot:
                self._slots.move_to_end(key)

    def _claim(self, key: str | None) -> _Slot[P]:
        """The key's slot with one call counted in flight, for a caller that runs the call
        (:meth:`execute`, :meth:`call`, the HTTP integrations) and then calls :meth:`_unclaim`.
        A key held already takes no lock and reads no clock (the key is stamped when the call
        ends): the call is counted in, then the key is checked to be still held (an eviction
        under the lock that saw no call in flight may have dropped it just before: then the count
        is taken back and the locked path claims).

        Every call is counted, even in a family whose policy counts its own (a bulkhead's
        ``in_use``): that count starts only at the policy's admission, and between the claim and
        the admission (another thread, a retry's backoff, a queue in an outer stage) the key
        could be evicted and the call run on a policy no longer held."""
        slot = self._slots.get(key) if type(key) is str else None
        if slot is not None:
            slot.calls.append(None)
            if self._slots.get(key) is slot:
                return slot
            slot.calls.pop()
        return self._slot(key, claim=True)

    def _unclaim(self, key: str | None, slot: _Slot[P]) -> None:
        """The call :meth:`_claim` counted has ended (restamped under the lock only when the
        stamp is older than the touch precision)."""
        if self._now() - slot.last_used >= self._touch_ns:
            self._release(key, slot)
        else:
            slot.calls.pop()

    # ------------------------------------------------------------------ control (see stoic.ControlPlane)
    def force_open(self, key: str | None = None) -> int:
        """Force the breaker of ``key`` open; with no key, every breaker held now and every one
        built later until :meth:`clear_forced_open`. Returns how many policies were forced.
        Raises ``TypeError`` when the family's policies have no ``force_open`` or an asynchronous
        one (stoic.fleet's), and then nothing changed; ``LookupError`` for a key the family does
        not hold."""
        with self._lock:
            if key is None:
                targets = [slot.policy for slot in self._slots.values()]
                if self._overflow is not None:
                    targets.append(self._overflow.policy)
                # Checked before the family is marked: a refusal must not leave every key
                # built later failing in its own forced open.
                for policy in targets:
                    _switch(policy, "force_open", self._label)
                if not targets:
                    _switch(self._sample(), "force_open", self._label)
                self._forced_all = True
            else:
                targets = [self._held(key).policy]
            # Under the lock: a retune rebuilding the keys (which reads each key's forced open)
            # must not land between the marking and the forcing, nor force the policies it replaced.
            for policy in targets:
                _force(policy, self._label)
        return len(targets)

    def clear_forced_open(self, key: str | None = None) -> int:
        """Lift a manual trip on ``key`` (every key when none is given): a forced-open breaker
        closes; one that opened by itself is left alone. Returns how many were cleared. Raises
        as :meth:`force_open` does (``TypeError`` for policies that are no breaker, or whose
        switches are asynchronous; ``LookupError`` for a key not held), and then nothing changed."""
        with self._lock:
            if key is None:
                targets = [slot.policy for slot in self._slots.values()]
                if self._overflow is not None:
                    targets.append(self._overflow.policy)
            else:
                targets = [self._held(key).policy]
            checked: list[object] = [*targets] if targets else [self._sample()]
            for policy in checked:  # (as a plain policy is checked: both switches)
                _switch(policy, "force_open", self._label)
                _switch(policy, "force_closed", self._label)
            if key is None:
                self._forced_all = False
            cleared = 0  # (under the lock, as force_open forces)
            for policy in targets:
                if is_forced_open(policy):
                    _switch(policy, "force_closed", self._label)()
                    cleared += 1
        return cleared

    def _sample(self) -> object:
        """What the family's policies are, to check a control action on while it holds none:
        the factory when it is a class (its methods are its policies'), else a throwaway policy
        built as the constructor's validation builds one (a factory function says nothing of
        what it returns)."""
        if isinstance(self._factory, type):
            return self._factory
        return self._factory(label=self._label, clock=self._clock, **self._config)

    def _held(self, key: str) -> _Slot[P]:
        _check_key(key)
        slot = self._slots.get(key)
        if slot is None and key == OVERFLOW_KEY:
            slot = self._overflow  # as policies lists it (a real key of that name comes first)
        if slot is None:
            raise LookupError(f"{self._label!r} holds no key {key!r}")
        return slot

    def retune(self, **changes: Any) -> int:
        """Swap the configuration of every key, and of the keys built later.

        A family of one of stoic's policy classes (``Keyed(CircuitBreaker, ...)``) retunes each
        key's policy in place, by that policy's own ``_retune`` (as :meth:`stoic.ControlPlane.retune`
        does for a plain policy: calls in flight keep their slots, permits and probes, state
        streams stay subscribed, what was learnt under the old configuration is dropped). A
        family built by any other factory gets a new policy per key, built from the old
        configuration updated with ``changes`` (a forced-open breaker stays forced, one a
        per-key ``Pipeline`` holds too: the new pipeline's like stage, the n-th breaker for the
        n-th); calls in flight finish on the policy that admitted them.

        All or nothing: ``TypeError`` for a parameter the factory does not take (or ``label`` /
        ``clock``), for policies that cannot be retuned (stoic.fleet's), or when a new pipeline
        has no stage to keep a forced breaker forced in, the
        factory's ``ValueError`` naming the parameter for a value out of range, and then the
        live policies and configuration are unchanged. Returns how many keys were
        retuned."""
        for name in ("label", "clock"):
            if name in changes:
                raise TypeError(f"{name} cannot be retuned (build another family)")
        if isinstance(self._factory, type) and getattr(self._factory, "_retune", False) is None:
            # A kind that says so (stoic.fleet's: the configuration is the fleet's) is refused as a
            # plain one is (stoic.ControlPlane.retune), not rebuilt with this process's own.
            raise TypeError(f"{self._label!r} holds {self._factory.__name__} policies, which cannot be retuned")
        _check_parameters(self._factory, changes)
        with self._lock:
            factory, clock = self._factory, self._clock
            in_place = isinstance(factory, type) and callable(getattr(factory, "_retune", None))
            # Later keys are built as the held ones are retuned: a kind whose retune derives a
            # setting from another (a limiter's burst that follows its rate) says how.
            derive = getattr(factory, "_retuned_config", None) if in_place else None
            config = derive(self._config, changes) if callable(derive) else {**self._config, **changes}
            factory(label=self._label, clock=clock, **config)  # validates: raises before anything changes
            slots = list(self._slots.values()) + ([self._overflow] if self._overflow is not None else [])
            rebuilt: list[tuple[_Slot[P], P, bool, list[object]]] = []
            if not in_place:
                for slot in slots:
                    policy = factory(label=slot.label, clock=clock, **config)
                    # A held key keeps its own state: under a family-wide force every key was
                    # forced when built or marked, so one not forced now was cleared on its own.
                    forced = is_forced_open(slot.policy)
                    if forced:
                        _switch(policy, "force_open", self._label)  # refused here, before any key changes
                    stages = _forced_stages(slot.policy, policy, self._label)
                    rebuilt.append((slot, policy, forced, stages))
            if in_place:
                _retune_every(slots, changes)
            self._config = config
            for slot, policy, forced, stages in rebuilt:
                if forced:
                    _force(policy, self._label)
                for stage in stages:
                    _force(stage, self._label)
                slot.policy = policy
        return len(slots)

    def __repr__(self) -> str:
        name = getattr(self._factory, "__qualname__", type(self._factory).__qualname__)
        return f"Keyed({name}, label={self._label!r}, keys={len(self._slots)}/{self._max_keys})"


def _retune_every(slots: list[_Slot[Any]], changes: dict[str, Any]) -> None:
    """Retune every slot's policy in place, all or nothing.

    A key's own state can refuse (a queued request above a new burst, queue management switched
    on while callers wait): every key is asked first, so a refusal changes no key. A kind that
    threads may use at once (a blocking limiter or bulkhead: ``_retune_apply``) is held under its
    own lock from its check to its change, every such key at once: a thread queueing on a key
    between the checks and the changes would otherwise make a later key refuse after the
    earlier ones changed. (Locks are taken under the family's, in slot order; a policy's code
    never waits for a family's lock, nor for another policy's.)"""
    policies: list[Any] = list({id(slot.policy): slot.policy for slot in slots}.values())
    with contextlib.ExitStack() as held:
        prepared: dict[int, Any] = {}
        for policy in policies:
            if callable(getattr(policy, "_retune_apply", None)):
                held.enter_context(policy._lock)
                fresh = policy._retune_prepare(changes)
                policy._check_retune(fresh)
                prepared[id(policy)] = fresh
            elif (check := getattr(policy, "_retune_check", None)) is not None:
                check(**changes)
        for policy in policies:
            if id(policy) in prepared:
                policy._retune_apply(prepared[id(policy)])
            else:
                policy._retune(**changes)


def _check_key(key: object) -> None:
    """``TypeError`` for a key that is not a ``str`` (or None), wherever a key is taken."""
    if key is not None and not isinstance(key, str):
        raise TypeError(f"a key must be a str (or None), got {type(key).__name__}")


def _key_attrs(key: str | None, reason: str) -> dict[str, Any]:
    return {"key": "" if key is None else encodable(key), "reason": reason}


def _switch(policy: object, name: str, label: str, *, plain: bool = False) -> Callable[[], object]:
    """``policy``'s ``force_open`` / ``force_closed`` (``name``); ``TypeError`` when it has none,
    or when it is a coroutine function (stoic.fleet's breakers: a store round trip this
    synchronous call cannot await; called, it would be dropped unawaited and do nothing)."""
    switch = getattr(policy, name, None)
    kind = policy.__name__ if isinstance(policy, type) else type(policy).__name__  # (a family's class)
    what = f"{label!r} is a {kind}" if plain else f"{label!r} holds {kind} policies"
    if not callable(switch):
        raise TypeError(f"{what}, which cannot be forced open")
    if inspect.iscoroutinefunction(switch):
        raise TypeError(f"{what}, whose {name}() is asynchronous: await it on the policy itself")
    return switch  # type: ignore[no-any-return]


def _force(policy: object, label: str) -> None:
    _switch(policy, "force_open", label)()


def _forced_stages(old: object, new: object, label: str) -> list[object]:
    """The stages of ``new`` to force open for a retune to keep what ``old`` had forced, when
    both are pipelines (a factory's per key): the n-th stage of a kind in ``new`` for each n-th
    of that kind forced open in ``old``. ``TypeError`` when ``new`` has no such stage, or one
    that cannot be forced (the retune would lift the kill switch: refused, nothing changed)."""
    before, after = getattr(old, "stages", None), getattr(new, "stages", None)
    if not isinstance(before, tuple):
        return []
    kinds = [type(stage) for stage in after] if isinstance(after, tuple) else []
    forced: list[object] = []
    for index, stage in enumerate(before):
        if not is_forced_open(stage):
            continue
        nth = sum(type(earlier) is type(stage) for earlier in before[:index])
        places = [place for place, kind in enumerate(kinds) if kind is type(stage)]
        if nth >= len(places):
            raise TypeError(f"{label!r}: the retuned policy has no {type(stage).__name__} stage to keep forced "
                            f"open in place of {stage!r}; clear it first, or retune to a like pipeline")
        target = after[places[nth]]  # type: ignore[index]
        _switch(target, "force_open", label)
        forced.append(target)
    return forced


def _check_parameters(factory: Callable[..., Any], config: Mapping[str, Any]) -> None:
    """``TypeError`` naming a configuration key ``factory`` does not take."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return  # no signature to read: the factory itself will say
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for name in config:
        if name not in params or params[name].kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(f"{getattr(factory, '__qualname__', factory)!r} has no parameter {name!r}")
