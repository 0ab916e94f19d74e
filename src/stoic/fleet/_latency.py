"""The shared latency signal: a mergeable sketch of a dependency's latencies kept in Redis
(seed 003, fleet-wide state, ``latency_digest_store``).

Two P-squared estimators cannot be merged into a valid quantile (each is five markers fitted to
its own stream), so replicas share a histogram instead: fixed log-scale buckets (8 linear
sub-buckets per power of two from 1 us to 137 s, so a bucket is at most 12.5 % wide), which merge
by addition. Each replica counts its samples locally and, at most once per ``interval``, adds
them to the fleet's sketch and reads the sum back in one script (``latency_push.lua``): one round
trip per interval, none per call, and never one a caller waits for under asyncio. The sketch
ages by forward decay (a sample's weight halves every ``half_life`` seconds of server time), so
old samples fade out; the key expires when nobody pushes.

A policy reads the quantile through an estimator (:meth:`SharedLatency.estimator`) that also
keeps the policy's own windowed P-squared estimate: it answers with the fleet's quantile while
the last read is fresh and holds enough samples, and with its own estimate otherwise (before
the first read, or while the store cannot be reached).
"""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any, Final

from .._clock import Clock, check_clock, current_clock
from .._durations import Seconds, to_ns
from .._quantile import WindowedQuantile, _check_quantile
from ._store import RedisStore, StoreError, check_key_part

_SUB: Final = 8  # linear sub-buckets per power of two
_LOW_EXP: Final = 11  # frexp exponent of 1024 ns (about 1 us): the first bucket starts there
BUCKETS: Final = (38 - _LOW_EXP) * _SUB  # up to 2**37 ns, about 137 s; beyond it, the last bucket


def bucket_of(ns: float) -> int:
    """The index of the bucket holding ``ns`` (clamped into the range)."""
    if ns < 1024.0:
        return 0
    m, e = math.frexp(ns)  # ns = m * 2**e, m in [0.5, 1)
    i = (e - _LOW_EXP) * _SUB + int((m * 2.0 - 1.0) * _SUB)
    return i if i < BUCKETS else BUCKETS - 1


def bucket_bounds(i: int) -> tuple[float, float]:
    """The ``[low, high)`` nanoseconds of bucket ``i``."""
    e, k = divmod(i, _SUB)
    base = math.ldexp(1.0, e + _LOW_EXP - 1)
    return base * (1.0 + k / _SUB), base * (1.0 + (k + 1) / _SUB)


def quantile_of(weights: dict[int, float], total: float, p: float) -> float | None:
    """The ``p``-quantile (ns) of a histogram of bucket weights, interpolated inside its bucket."""
    if total <= 0.0:
        return None
    target = p * total
    seen = 0.0
    for i in sorted(weights):
        w = weights[i]
        if w <= 0.0:
            continue
        if seen + w >= target:
            low, high = bucket_bounds(i)
            return low + (high - low) * max(0.0, min(1.0, (target - seen) / w))
        seen += w
    return bucket_bounds(max(weights))[1]


class SharedLatency:
    """A dependency's latency distribution shared by every replica through the store.

    ``SharedLatency(*, store, label, interval=1.0, half_life=10.0, clock=None)``:

    - ``store``: the :class:`RedisStore` (asyncio client for asyncio policies; a store built
      from a sync client pushes inline, from the thread that records, once per interval);
      ``label`` names the sketch (``{prefix:label}:latency``); characters that would break a key
      are a ``ValueError``;
    - ``interval`` (seconds > 0, default 1.0): how often this replica pushes its counts and
      reads the fleet's back (the most the shared quantile lags the local samples);
    - ``half_life`` (seconds > 0, default 10.0): a sample's weight halves every half-life of
      server time (the sketch's rolling window), at least 1 us; the key expires after 10
      half-lives unused;
    - ``clock``: what the push interval is measured on.

    Pass it to a policy that estimates a latency quantile: ``Hedge(..., quantile=0.95,
    latency_digest=shared)`` or ``AdaptiveBulkhead(..., latency_quantile=0.9,
    latency_digest=shared)``. One ``SharedLatency`` per measured stream: two policies measuring
    the same calls into one sketch would count each call twice. ``TypeError`` for a store or a
    clock of another type, ``ValueError`` for non-positive durations.
    """

    def __init__(
        self, *, store: RedisStore, label: str, interval: Seconds = 1.0, half_life: Seconds = 10.0,
        clock: Clock | None = None,
    ) -> None:
        self._label = check_key_part(label, "label")
        if not isinstance(store, RedisStore):
            raise TypeError(f"store must be a RedisStore, got {type(store).__name__}")
        self._store = store
        self._interval_ns = to_ns(interval, "interval")
        half_ns = to_ns(half_life, "half_life")
        if half_ns < 1000:
            raise ValueError(f"half_life must be at least 1 microsecond (the resolution of Redis TIME), "
                             f"got {half_life!r}")
        self._half_us = half_ns // 1000
        ttl_ms = max(10 * half_ns, 3 * self._interval_ns) // 1_000_000 + 1000
        self._config = (self._half_us, ttl_ms)
        self._clock = check_clock(clock) if clock is not None else current_clock()
        self._keys = store.keys(label, "latency")
        self._lock = threading.Lock()
        self._pending: dict[int, int] = {}
        self._due = 0  # the first sample pushes at once (and learns the fleet's sketch)
        self._busy = False  # a push task is being started or running (asyncio)
        # A push on the sync client is under way in some thread (one at a time: a record() due
        # meanwhile leaves its sample for a later push, a flush_blocking() waits for it on
        # _pushed); _answered: whether the store answered the last one to end.
        self._inline = False
        self._answered = False
        self._pushed = threading.Condition(self._lock)
        # flush() calls waiting for that push (on their own loops): each is sent _answered.
        self._waiting: list[asyncio.Future[bool]] = []
        self._task: asyncio.Task[bool] | None = None
        self._weights: dict[int, float] | None = None  # the fleet's sketch at the last read
        self._total = 0.0  # its effective samples (weights scaled to now)
        self._read_at = -1  # clock ns of the last successful read, -1: none
        self._cache: dict[float, float | None] = {}

    @property
    def label(self) -> str:
        """The sketch's label."""
        return self._label

    @property
    def samples(self) -> float:
        """The fleet's effective sample count at the last read (decayed weights; 0.0 before any
        read or after a failed contact)."""
        return self._total if self._weights is not None else 0.0

    @property
    def degraded(self) -> bool:
        """True when the last contact with the store failed (estimators answer locally)."""
        return self._weights is None and self._read_at != -1

    def estimator(self, quantile: float, window: int = 1000, warmup: int | None = None,
                  cap: float | None = None) -> SharedQuantile:
        """A quantile estimator for a policy: the fleet's ``quantile`` of this sketch, or its own
        :class:`WindowedQuantile` (``window``, ``warmup``, ``cap``: the local estimate only, the
        sketch takes every latency as it is) when the fleet's is unknown. Latencies, ``cap``
        and the estimate are nanoseconds. ``ValueError`` as ``WindowedQuantile``'s: ``quantile``
        outside (0, 1), ``window`` < 5, ``warmup`` outside [5, window], ``cap`` not a finite
        number > 0 (or None)."""
        return SharedQuantile(self, quantile, window, warmup, cap)

    def quantile(self, p: float) -> float | None:
        """The fleet's ``p``-quantile in nanoseconds at the last fresh read (no older than three
        intervals), or ``None``. ``ValueError`` for ``p`` outside (0, 1)."""
        weights = self._weights
        if weights is None or self._clock.now_ns() - self._read_at > 3 * self._interval_ns:
            return None
        cache = self._cache
        if p not in cache:
            cache[_check_quantile(p, "p")] = quantile_of(weights, self._total, p)
        return cache[p]

    # ------------------------------------------------------------------ pushing
    def record(self, latency_ns: float) -> None:
        """Count one sample locally; start a push when the interval is due (a task under a
        running loop, inline on a store built from a sync client otherwise)."""
        i = bucket_of(latency_ns)
        now = self._clock.now_ns()
        with self._lock:
            pending = self._pending
            pending[i] = pending.get(i, 0) + 1
            if now < self._due:
                return
            task = self._task
            # Busy unless the push task is over (one whose loop closed before it ran never clears it).
            if self._inline or (self._busy and (task is None or not task.done())):
                return
            self._due = now + self._interval_ns
            # Which push is decided under the lock, so that no other thread starts one meanwhile.
            try:
                loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None and self._store.client is not None:
                self._busy = True
            elif self._store.sync_client is not None:
                loop = None
                self._inline = True
            else:
                return  # no way to reach the store from here: the local estimate decides
        if loop is not None:
            self._task = loop.create_task(self._push())
        else:
            self._push_blocking()

    def _batch(self) -> tuple[int, ...]:
        with self._lock:
            batch, self._pending = self._pending, {}
        flat: list[int] = []
        for i, n in batch.items():
            flat += (i, n)
        return (*self._config, *flat)

    async def flush(self) -> bool:
        """Push this replica's counts and read the fleet's sketch now (one round trip); True when
        the store answered. Waits for a push already under way (a background one, another
        flush's, or one on the sync client in another thread: a ``flush_blocking()``, a sample's
        inline push), then pushes the counts recorded after it took its batch, if any, else
        returns whether the store answered it. The push runs as a task: a flush cancelled while
        it waits still delivers the batch it took."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                task = self._task
                if self._inline:  # a push on the sync client: woken by its end (_push_blocking)
                    waited: asyncio.Future[bool] = loop.create_future()
                    self._waiting.append(waited)
                elif task is not None and not task.done() and task.get_loop() is loop:
                    waited = asyncio.shield(task)
                else:
                    self._busy = True
                    self._due = self._clock.now_ns() + self._interval_ns
                    break
            try:
                answered = await waited
            except BaseException:
                with self._lock:
                    if waited in self._waiting:
                        self._waiting.remove(waited)
                raise
            # A push takes its batch in its first step (inside create_task under an eager task
            # factory): samples recorded since are still pending.
            with self._lock:
                if not self._pending:
                    return answered
        task = self._task = loop.create_task(self._push())
        return await asyncio.shield(task)

    def flush_blocking(self) -> bool:
        """:meth:`flush` on the store's sync client, from any thread: push this replica's counts
        and read the fleet's sketch now; True when the store answered.

        One push on the sync client runs at a time. A flush arriving while one is under way (a
        sample's inline push, another thread's flush), or while a push task runs on an event
        loop in another thread (a ``flush()``, a sample's background push), waits for it (a wait
        bounded by the store's budget per push; never for a task of this thread's own loop, nor
        of a loop that has stopped), then pushes only if counts were recorded after it took its
        batch, else returns whether the store answered it: flushes at once share one push, and
        every count is sent once (a failed push's counts are dropped, as a background push's
        are). A store error (unreachable, over the budget, resting, a reply of the wrong shape)
        is a ``False``, never raised; the local estimates decide meanwhile."""
        with self._lock:
            waited = False
            while True:
                if self._inline:
                    self._pushed.wait()
                elif self._task_elsewhere():
                    # Re-checked at least every budget: a loop stopped meanwhile never ends it.
                    self._pushed.wait(self._store.budget)
                else:
                    break
                waited = True
            if waited and not self._pending:
                return self._answered
            self._inline = True
            self._due = self._clock.now_ns() + self._interval_ns
        return self._push_blocking()

    def _task_elsewhere(self) -> bool:
        """Whether a push task is under way on an event loop running in another thread (under
        the lock): one a blocking flush can wait for (never its own thread's loop, which cannot
        run while it waits, nor a loop stopped or closed)."""
        task = self._task
        if not self._busy or task is None or task.done():
            return False
        loop = task.get_loop()
        if loop.is_closed() or not loop.is_running():
            return False
        try:
            return asyncio.get_running_loop() is not loop
        except RuntimeError:
            return True

    async def _push(self) -> bool:
        answered = False
        try:
            try:
                reply = await self._store.call("latency_push", self._keys, self._batch())
            except StoreError:
                answered = self._failed()
            else:
                answered = self._read(reply)
            return answered
        finally:
            # Read before it ends (a waiting blocking flush returns what it read), ended however
            # the call went.
            with self._lock:
                self._busy = False
                self._answered = answered
                self._pushed.notify_all()

    def _push_blocking(self) -> bool:
        """The push on the sync client, by the thread that set ``_inline`` (under the lock)."""
        answered = False
        try:
            try:
                reply = self._store.call_blocking("latency_push", self._keys, self._batch())
            except StoreError:
                answered = self._failed()
            else:
                answered = self._read(reply)
            return answered
        finally:
            # Read before it ends (a waiting flush returns what it read), and ended however the
            # call went (an error other than StoreError, an interrupt): no flush waits for ever.
            with self._lock:
                self._inline = False
                self._answered = answered
                self._pushed.notify_all()
                waiting, self._waiting = self._waiting, []
            for inline in waiting:
                try:
                    inline.get_loop().call_soon_threadsafe(_wake, inline, answered)
                except RuntimeError:
                    pass  # its loop is closed: nobody awaits it any more

    def _failed(self) -> bool:
        # The counts of a failed push are dropped: they live on in each policy's own estimate.
        self._weights = None
        self._read_at = max(self._read_at, 0)
        return False

    def _read(self, reply: list[Any]) -> bool:
        try:
            weights, total = self._parse(reply)
        except (StoreError, ValueError, TypeError, OverflowError) as exc:
            error = exc if isinstance(exc, StoreError) else StoreError(
                f"latency_push answered an unexpected reply ({exc})", operation="latency_push", unavailable=False)
            self._store.report(error)
            return self._failed()
        self._store.accepted()
        self._weights = weights
        self._total = total
        self._cache = {}
        self._read_at = self._clock.now_ns()
        return True

    def _parse(self, reply: list[Any]) -> tuple[dict[int, float], float]:
        age_us = reply[0] if reply else None
        if type(age_us) is not int or len(reply) % 2 != 1:
            raise StoreError(f"latency_push answered {reply[:3]!r}", operation="latency_push", unavailable=False)
        weights: dict[int, float] = {}
        raw_total = 0.0
        for field, value in zip(reply[1::2], reply[2::2], strict=True):
            if field in (b"L", "L"):
                continue
            i = int(field)
            w = float(value)
            if not 0 <= i < BUCKETS or not w >= 0.0 or math.isinf(w):
                raise ValueError(f"bucket {field!r} = {value!r}")
            weights[i] = w
            raw_total += w
        return weights, raw_total * 2.0 ** (-age_us / self._half_us)

    def __repr__(self) -> str:
        return f"SharedLatency(label={self._label!r}, samples={self.samples:.0f}, store={self._store!r})"


def _wake(waiter: asyncio.Future[bool], answered: bool) -> None:
    """Give a flush() waiting for a push on the sync client that push's answer (on its loop)."""
    if not waiter.done():
        waiter.set_result(answered)


def check_digest(digest: object, name: str) -> SharedLatency:
    """``digest`` when it is a :class:`SharedLatency`, else ``TypeError`` naming ``name``."""
    if not isinstance(digest, SharedLatency):
        raise TypeError(f"{name} must be a stoic.fleet.SharedLatency, got {type(digest).__name__}")
    return digest


class SharedQuantile:
    """One policy's quantile estimate over a :class:`SharedLatency` (what
    :meth:`SharedLatency.estimator` returns): :meth:`add` feeds both the policy's own
    :class:`WindowedQuantile` and the shared sketch; :attr:`value` is the fleet's quantile when a
    fresh read made after this estimator was created holds at least ``warmup`` samples, else the
    local estimate (``None`` before warm-up), in nanoseconds."""

    __slots__ = ("_born", "_digest", "_local", "_warmup", "p")

    def __init__(self, digest: SharedLatency, p: float, window: int, warmup: int | None,
                 cap: float | None = None) -> None:
        self.p = _check_quantile(p, "p")
        self._local = WindowedQuantile(self.p, window, warmup, cap)
        self._warmup = self._local.warmup if warmup is None else warmup
        self._digest = digest
        # A fresh estimator (a new AIMD epoch) never answers with a read made before it existed.
        self._born = digest._clock.now_ns()

    def add(self, x: float) -> None:
        """Take one latency (ns) into the local estimate and the shared sketch."""
        self._local.add(x)
        self._digest.record(x)

    @property
    def value(self) -> float | None:
        """The fleet's quantile (ns) when known and fresh, else the local estimate."""
        digest = self._digest
        if digest._read_at >= self._born and digest.samples >= self._warmup:
            shared = digest.quantile(self.p)
            if shared is not None:
                return shared
        return self._local.value

    @property
    def local(self) -> WindowedQuantile:
        """This replica's own estimate (what answers when the fleet's is unknown)."""
        return self._local


__all__ = ["BUCKETS", "SharedLatency", "SharedQuantile", "bucket_bounds", "bucket_of", "check_digest", "quantile_of"]
