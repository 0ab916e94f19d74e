"""The Redis store: Lua scripts run by SHA under a tight per-call budget, behind a health breaker.

Seed 003, "fleet-wide state" (``fail_open_on_store_error``). redis-py is imported here, when a
store is built, never by ``import stoic``. Every decision is one script (files in ``scripts/``
beside this module), loaded once and called by SHA; a ``NOSCRIPT`` reply (``SCRIPT FLUSH``, a
restarted or failed-over server) loads it again and repeats the call once.

A store call never goes through redis-py's ``execute_command``: that path retries on its own
(redis-py 6+ retries three times by default), which would turn a few-millisecond budget into
several. The store borrows a connection from the client's pool, sends one command and reads one
reply, all inside ``asyncio.timeout(budget)``. redis-py disconnects a connection whose read or
write is interrupted by any ``BaseException`` (a cancellation included); the store disconnects
it again itself before handing it back, so no connection is ever returned to the pool with a
reply still owed (the next command would read the previous one's answer).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import deque
from collections.abc import Sequence
from importlib import resources
from typing import Any, Final
from urllib.parse import urlsplit

from .. import _deadline, _metrics
from .._clock import Clock, current_clock
from .._durations import Seconds, to_ns
from .._errors import CircuitOpen
from ..breaker import CircuitBreaker, CountWindow, OpenDuration
from ..events import Level, emit
from ..events._sinks import kind_floor

# The sinks wanting fleet events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("fleet")

_KEY_PART: Final = re.compile(r"[A-Za-z0-9_.:/@+=-]{1,200}")
_SCHEMES: Final = ("redis", "rediss", "unix")


class StoreError(Exception):
    """A store call failed: the server could not be reached in the budget, answered with an
    error, or answered with a reply of an unexpected shape (another program wrote the key).

    ``operation`` is the script's name. ``unavailable`` is True for connection errors and
    timeouts (these count against the store's health), False for answers that were wrong.
    Policies never raise it to callers: they fail open or closed as configured.
    """

    def __init__(self, message: str, *, operation: str, unavailable: bool) -> None:
        super().__init__(message)
        self.operation = operation
        self.unavailable = unavailable


def check_key_part(value: object, name: str) -> str:
    """Validate a label or prefix used inside a Redis key: ``TypeError`` when not a str,
    ``ValueError`` naming ``name`` unless it is 1-200 characters of ``A-Z a-z 0-9 _ . : / @ + = -``
    (braces would break the hash tag, whitespace and control characters the key)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not _KEY_PART.fullmatch(value):
        raise ValueError(
            f"{name} must be 1-200 characters of A-Z a-z 0-9 _ . : / @ + = - (no braces, spaces or "
            f"control characters: they would break the Redis key), got {value!r}"
        )
    return value


class _Script:
    """One Lua script: its source, its SHA1 and its name (for events and errors)."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


def _load_script(name: str, prelude: str = "") -> _Script:
    text = resources.files("stoic.fleet").joinpath("scripts", f"{name}.lua").read_text(encoding="utf-8")
    return _Script(name, prelude + text)


def _scripts() -> dict[str, _Script]:
    common = resources.files("stoic.fleet").joinpath("scripts", "breaker_common.lua").read_text(encoding="utf-8")
    scripts = {name: _load_script(name) for name in ("limiter_take", "latency_push")}
    for name in ("breaker_refresh", "breaker_trip", "breaker_probe", "breaker_done", "breaker_force"):
        scripts[name] = _load_script(name, common + "\n")
    return scripts


class RedisStore:
    """Where fleet-wide policy state lives: one Redis (or Redis Cluster) reached through redis-py.

    ``RedisStore(client, *, prefix="stoic", budget=0.005, probe_interval=1.0, label="redis", clock=None)``:

    - ``client``: a ``redis.asyncio.Redis`` (for the asyncio policies), a ``redis.Redis``
      (for :meth:`call_blocking`), or a URL string (``redis://``, ``rediss://``, ``unix://``)
      from which both are built with ``socket_timeout`` and ``socket_connect_timeout`` set to
      the budget and redis-py's retries off (the sync one on a ``redis.BlockingConnectionPool``
      of 100, so a thread finding every connection in use waits for one within the budget; a
      ``redis.Redis`` passed in lends its settings to such a pool of the store's own, since its
      own pool connects on its timeouts, none by default);
      or a Redis Cluster client, ``redis.asyncio.RedisCluster`` (asyncio) or
      ``redis.cluster.RedisCluster`` (blocking): every script's keys share one hash tag, so each
      call goes to the one node owning its slot, routed (and re-routed after ``MOVED``) by the
      cluster client within the budget;
    - ``prefix``: the first part of every key's hash tag ``{prefix:label}`` (the plain text: with
      ``:`` in both a prefix and a label, two pairs can spell one tag and share their state; see
      docs/fleet.md, "Key layout");
    - ``budget``: seconds (float or timedelta, > 0, default 0.005 = 5 ms) one store call may take,
      connecting included; past it the call is a store error and the policy fails open/closed;
    - ``probe_interval``: seconds (> 0, default 1.0) the store is left alone after a failed call
      before one call probes it again: an outage costs one budget per interval, not per call;
    - ``label``: names the store on its events and on its health breaker (``<label>.health``);
    - ``clock``: the clock the health breaker measures the probe interval on.

    Raises ``ValueError`` naming the parameter for an unparsable URL, a non-positive budget or
    interval, or a prefix/label with characters that would break a key; ``TypeError`` for a
    client of another type. Importing redis-py happens here (``ImportError`` with the extra to
    install when it is missing: ``pip install stoic[redis]``).

    One store may serve successive event loops (``asyncio.run`` called again, a test framework's
    loop per test): asyncio connections belong to the loop that opened them, so on a new loop
    the store drops the old ones and opens new ones. A finished loop cannot close its sockets
    any more, so the dropped ones are closed by the garbage collector, with a
    ``ResourceWarning`` each. ``await store.aclose()`` before a loop ends closes them cleanly,
    and the store opens new connections on its next call.
    """

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "stoic",
        budget: Seconds = 0.005,
        probe_interval: Seconds = 1.0,
        label: str = "redis",
        clock: Clock | None = None,
    ) -> None:
        try:
            import redis
            import redis.asyncio
        except ImportError as exc:  # pragma: no cover - the extra is installed in every test run
            raise ImportError("stoic.fleet needs redis-py: pip install 'stoic[redis]'") from exc
        self._prefix = check_key_part(prefix, "prefix")
        self._label = check_key_part(label, "label")
        self._budget_ns = to_ns(budget, "budget")
        self._budget = self._budget_ns / 1e9
        probe_ns = to_ns(probe_interval, "probe_interval")
        self._clock = clock if clock is not None else current_clock()
        self._async: Any = None
        self._sync: Any = None
        self._sync_pool: Any = None  # where call_blocking takes its connections (not on a cluster)
        import redis.asyncio.cluster
        import redis.cluster

        # A cluster client routes each call by its keys' slot; a plain one is used directly.
        self._cluster = isinstance(client, (redis.asyncio.cluster.RedisCluster, redis.cluster.RedisCluster))
        if isinstance(client, str):
            self._async, self._sync = self._from_url(client, redis)
            self._sync_pool = self._sync.connection_pool
        elif isinstance(client, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)):
            self._async = client
        elif isinstance(client, (redis.Redis, redis.cluster.RedisCluster)):
            self._sync = client
            if isinstance(client, redis.Redis):
                self._sync_pool = self._bounded_pool(client.connection_pool, redis)
        else:
            raise TypeError(
                "client must be a redis.asyncio.Redis, a redis.Redis, a redis.asyncio.RedisCluster, a "
                f"redis.cluster.RedisCluster or a URL str, got {type(client).__name__}"
            )
        self._redis = redis
        self._scripts = _scripts()
        # The store's own health: one failure opens it for probe_interval (no jitter: the
        # interval is the promise), then one call probes. Only unavailability counts.
        self._health = CircuitBreaker(
            label=f"{self._label}.health",
            window=CountWindow(1),
            minimum_calls=1,
            failure_rate_threshold=1.0,
            open_duration=OpenDuration.fixed(probe_ns / 1e9, jitter=0.0),
            half_open_probes=1,
            half_open_timeout=max(1.0, 10 * self._budget),
            record_when=lambda error: isinstance(error, StoreError) and error.unavailable,
            clock=self._clock,
        )
        self._failing_since: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Connections this store took from the asyncio client's pool and keeps for its own calls
        # (as many as its concurrent calls at the peak): the pool's get/release (a lock, a
        # liveness poll, observability hooks) would cost more than the script; aclose() gives
        # them back.
        self._idle: list[Any] = []
        self._held = 0  # connections this store took from the pool (idle or in use)
        # Calls waiting for one of the store's connections while the pool has none left.
        self._wanting: deque[asyncio.Future[Any]] = deque()
        self._packed: dict[tuple[Any, ...], list[bytes]] = {}

    def _from_url(self, url: str, redis: Any) -> tuple[Any, Any]:
        try:
            parts = urlsplit(url)
            port = parts.port  # raises ValueError for a port that is not a number
        except ValueError as exc:
            raise ValueError(f"url cannot be parsed: {url!r} ({exc})") from None
        if parts.scheme not in _SCHEMES or (parts.scheme != "unix" and not parts.hostname) or (
            parts.scheme == "unix" and not parts.path
        ):
            raise ValueError(f"url must be redis://host[:port][/db], rediss://... or unix:///path, got {url!r}")
        del port
        import redis.asyncio.retry
        import redis.backoff
        import redis.retry

        # The asyncio client gets no socket_timeout (redis-py 8 defaults it to 5 s): every call
        # already runs under asyncio.timeout(budget), and a second timer per read and per write
        # (a wait_for task around each send) is pure cost.
        try:
            asynchronous = redis.asyncio.Redis.from_url(
                url, retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0), socket_timeout=None,
                socket_connect_timeout=self._budget)
            # A blocking pool of the plain pool's size (100, unless the URL says otherwise): a
            # thread finding every connection in use waits for one, within the budget, rather
            # than failing (more threads at once than connections is no outage).
            synchronous = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(
                url, max_connections=100, timeout=self._budget, retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
                socket_timeout=self._budget, socket_connect_timeout=self._budget))
        except ValueError as exc:
            raise ValueError(f"url cannot be parsed: {url!r} ({exc})") from None
        synchronous.auto_close_connection_pool = True  # (as from_url's: close() closes the pool)
        return asynchronous, synchronous

    def _bounded_pool(self, pool: Any, redis: Any) -> Any:
        """The pool ``call_blocking`` uses with a ``redis.Redis`` passed in: the client's connection
        settings (its host, credentials, TLS, database), with connecting, the handshake, every
        read and write bounded by the budget and redis-py's retries off, as a store built from a
        URL has. The client's own pool cannot be used: it connects (and reads the handshake's
        replies) on the client's timeouts, none by default, and retries a refused connection
        with its own backoff, so a hung or unreachable server held the calling thread past any
        budget. A ``redis.BlockingConnectionPool`` of the client's size (at most 100): a thread
        finding every connection in use waits for one within the budget."""
        import redis.backoff
        import redis.retry

        settings = dict(pool.connection_kwargs)
        settings.update(socket_timeout=self._budget, socket_connect_timeout=self._budget,
                        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))
        size = min(int(getattr(pool, "max_connections", 100) or 100), 100)
        return redis.BlockingConnectionPool(connection_class=pool.connection_class, max_connections=size,
                                            timeout=self._budget, **settings)

    # ------------------------------------------------------------------ configuration
    @property
    def prefix(self) -> str:
        """The first part of every key's hash tag."""
        return self._prefix

    @property
    def label(self) -> str:
        """The store's label (its events; its health breaker is ``<label>.health``)."""
        return self._label

    @property
    def budget(self) -> float:
        """Seconds one store call may take."""
        return self._budget

    @property
    def health(self) -> CircuitBreaker:
        """The breaker in front of the store (open: calls skip the store until it is probed)."""
        return self._health

    @property
    def client(self) -> Any:
        """The ``redis.asyncio.Redis`` client (``None`` when built from a sync client)."""
        return self._async

    @property
    def sync_client(self) -> Any:
        """The ``redis.Redis`` client (``None`` when built from an asyncio client)."""
        return self._sync

    def keys(self, label: str, *suffixes: str) -> list[str]:
        """The keys of the policy ``label``: ``{prefix:label}:suffix`` each (one hash tag, so one
        Redis Cluster slot)."""
        return [f"{{{self._prefix}:{label}}}:{suffix}" for suffix in suffixes]

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self._prefix!r}, budget={self._budget!r}, label={self._label!r})"

    # ------------------------------------------------------------------ calls
    async def call(
        self, script: str, keys: Sequence[str], args: Sequence[int | float | str], *, repeat: bool = False,
    ) -> list[Any]:
        """Run ``script`` (by SHA, loading it on ``NOSCRIPT``) on ``keys`` with ``args``; return its
        reply as a list. Raises :class:`StoreError` for anything but a list reply, within the budget;
        :class:`stoic.CircuitOpen` is turned into a ``StoreError`` too (the store is resting after a
        failure: the call costs nothing). Cancellation propagates (``asyncio.CancelledError``).
        """
        if self._async is None:
            raise StoreError("the store was built from a sync client: use call_blocking", operation=script,
                             unavailable=False)
        # The budget bounds the call, not the caller's ambient deadline: one passed while the
        # operation ran must not have the health breaker refuse (a trip, a probe's report, a
        # try_acquire would be lost to a DeadlineExceeded). A deadline that fires during the call
        # still cancels it.
        hidden = _deadline._current.set(None) if _deadline.ever_set else None
        try:
            reply = await self._health.execute(self._timed, self._scripts[script], keys, args, repeat)
        except CircuitOpen:
            raise self._resting(script) from None
        except StoreError as exc:
            self.report(exc)
            raise
        finally:
            if hidden is not None:
                _deadline._current.reset(hidden)
        return self._answered(script, reply)

    async def _timed(
        self, script: _Script, keys: Sequence[str], args: Sequence[int | float | str], repeat: bool = False,
    ) -> Any:
        redis = self._redis
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            async with asyncio.timeout(self._budget):
                if self._cluster:
                    return await self._cluster_roundtrip(script, keys, command)
                try:
                    return await self._roundtrip(command, repeat)
                except redis.exceptions.NoScriptError:
                    await self._roundtrip(("SCRIPT", "LOAD", script.source), False)
                    return await self._roundtrip(command, repeat)
        except TimeoutError as exc:
            # (Chained: events and metrics name it by its cause, TimeoutError, as the sync path's.)
            raise StoreError(f"{script.name} took longer than the {self._budget:g} s budget",
                             operation=script.name, unavailable=True) from exc
        except Exception as exc:
            failure = self._failure(script, exc)
            if failure is exc:
                raise
            raise failure from exc

    def _failure(self, script: _Script, exc: Exception) -> Exception:
        """The StoreError for a redis-py exception (connection trouble, a cluster without a node
        for the slot: unavailable; an error reply: not); anything else is not the store's."""
        errors = self._redis.exceptions
        if isinstance(exc, (errors.ConnectionError, errors.TimeoutError, OSError, errors.ClusterError,
                            errors.RedisClusterException)):
            return StoreError(f"{script.name}: {type(exc).__name__}", operation=script.name, unavailable=True)
        if isinstance(exc, errors.RedisError):
            return StoreError(f"{script.name}: {type(exc).__name__}", operation=script.name, unavailable=False)
        return exc

    async def _cluster_roundtrip(self, script: _Script, keys: Sequence[str], command: tuple[Any, ...]) -> Any:
        # The cluster client picks the node owning the keys' slot and follows MOVED/ASK; the
        # asyncio timeout around it bounds its own retries to the budget.
        client = self._async
        try:
            return await client.execute_command(*command)
        except self._redis.exceptions.NoScriptError:
            node = client.get_node_from_key(keys[0])
            await client.execute_command("SCRIPT LOAD", script.source, target_nodes=node)
            return await client.execute_command(*command)

    async def _roundtrip(self, command: tuple[Any, ...], repeat: bool) -> Any:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Connections belong to the loop that opened them: under a later asyncio.run the old
            # ones are dropped (their loop is gone) and new ones are opened on this loop.
            if self._loop is not None:
                self._idle.clear()
                self._wanting.clear()
                self._held = 0
                self._async.connection_pool.reset()
            self._loop = loop
        idle = self._idle
        conn = idle.pop() if idle else await self._connection()
        try:
            if repeat:
                # The same command again and again (a limiter's one-permit take): packed once.
                packed = self._packed.get(command)
                if packed is None:
                    if len(self._packed) >= 64:
                        self._packed.clear()
                    packed = self._packed[command] = conn.pack_command(*command)
                await conn.send_packed_command(packed)
            else:
                await conn.send_command(*command)
            return await conn.read_response()
        except self._redis.exceptions.ResponseError:
            raise  # an error reply was read in full: the connection is in step
        except BaseException:
            # Interrupted mid-command (a timeout, a cancellation, a dead socket): a reply may still
            # be owed on this connection, so it is closed before it goes back to the pool.
            await conn.disconnect(nowait=True)
            raise
        finally:
            # (a closed one reconnects on its next command)
            if self._wanting:
                self._give_back(conn)
            else:
                idle.append(conn)

    async def _connection(self) -> Any:
        """A connection for a call that found none of the store's idle: a new one from the
        client's pool or, when the pool has none left (its ``max_connections``, 100 by default in
        redis-py) and the store holds some, the first of them to come back, waited for in FIFO
        order within the call's budget. A burst of calls larger than the pool is not an outage."""
        while True:
            self._held += 1  # (counted while it connects: calls arriving meanwhile wait for it)
            try:
                return await self._async.connection_pool.get_connection()
            except self._redis.exceptions.MaxConnectionsError:
                self._held -= 1
                if not self._held:
                    raise  # the application holds every connection: the store cannot be used
            except BaseException:
                self._held -= 1
                self._give_back(None)  # the pool has room again: the next waiter tries for it
                raise
            waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._wanting.append(waiter)
            try:
                conn = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._give_back(waiter.result())  # handed over as its caller left: passed on
                else:
                    try:
                        self._wanting.remove(waiter)
                    except ValueError:
                        pass
                raise
            if conn is not None:
                return conn

    def _give_back(self, conn: Any) -> None:
        """A call is done with ``conn`` (None: a connection failed to open, so the pool has room):
        it goes to the first call waiting for one, else back to the idle ones."""
        wanting = self._wanting
        while wanting:
            waiter = wanting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self._idle.append(conn)

    def call_blocking(self, script: str, keys: Sequence[str], args: Sequence[int | float | str]) -> list[Any]:
        """:meth:`call` for threads, on the sync client (each read bounded by the budget)."""
        if self._sync is None:
            raise StoreError("the store was built from an asyncio client: use call", operation=script,
                             unavailable=False)
        hidden = _deadline._current.set(None) if _deadline.ever_set else None  # (as in call)
        try:
            reply = self._health.call(self._timed_blocking, self._scripts[script], keys, args)
        except CircuitOpen:
            raise self._resting(script) from None
        except StoreError as exc:
            self.report(exc)
            raise
        finally:
            if hidden is not None:
                _deadline._current.reset(hidden)
        return self._answered(script, reply)

    def _resting(self, script: str) -> StoreError:
        """The error of a call skipped because the store's health breaker is open."""
        return StoreError(f"store {self._label} is resting after a failure", operation=script, unavailable=True)

    def _answered(self, script: str, reply: Any) -> list[Any]:
        """A reply that came back: a list, or a store error of shape. (The store has recovered
        only once a policy could use it: :meth:`accepted`.)"""
        if not isinstance(reply, list):
            wrong = StoreError(f"{script} answered {type(reply).__name__}, not a list", operation=script,
                               unavailable=False)
            self.report(wrong)
            raise wrong
        return reply

    def _timed_blocking(self, script: _Script, keys: Sequence[str], args: Sequence[int | float | str]) -> Any:
        redis = self._redis
        give_up = time.monotonic() + self._budget
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            if self._cluster:
                return self._cluster_blocking(script, keys, command, give_up)
            try:
                return self._roundtrip_blocking(give_up, *command)
            except redis.exceptions.NoScriptError:
                self._roundtrip_blocking(give_up, "SCRIPT", "LOAD", script.source)
                return self._roundtrip_blocking(give_up, *command)
        except Exception as exc:
            failure = self._failure(script, exc)
            if failure is exc:
                raise
            raise failure from exc

    def _cluster_blocking(self, script: _Script, keys: Sequence[str], command: tuple[Any, ...],
                          give_up: float) -> Any:
        # Each read is bounded by the client's socket_timeout (build it with the budget and
        # retry=Retry(NoBackoff(), 0), see docs/fleet.md); a retry past the budget is refused here.
        client = self._sync
        try:
            return client.execute_command(*command)
        except self._redis.exceptions.NoScriptError:
            if time.monotonic() >= give_up:
                raise self._redis.exceptions.TimeoutError("store budget spent") from None
            client.execute_command("SCRIPT LOAD", script.source, target_nodes=client.get_node_from_key(keys[0]))
            return client.execute_command(*command)

    def _roundtrip_blocking(self, give_up: float, *command: Any) -> Any:
        left = give_up - time.monotonic()
        if left <= 0:
            raise self._redis.exceptions.TimeoutError("store budget spent")
        pool = self._sync_pool
        conn = pool.get_connection()
        left = give_up - time.monotonic()  # (after any wait for a connection)
        if left <= 0:
            pool.release(conn)
            raise self._redis.exceptions.TimeoutError("store budget spent")
        try:
            conn.send_command(*command)
            return conn.read_response(timeout=left)
        except self._redis.exceptions.ResponseError:
            raise
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    # ------------------------------------------------------------------ events
    def report(self, exc: StoreError) -> None:
        """Emit ``fleet.store_error`` for ``exc`` (policies call it for replies of the wrong shape)."""
        now = self._clock.now_ns()
        if self._failing_since is None:
            self._failing_since = now
        cause = exc.__cause__
        if _metrics.state.enabled:
            kind = type(cause).__qualname__ if cause is not None else type(exc).__qualname__
            _metrics.count_shared("fleet", self._label, ("stoic.fleet.store.errors", kind))
        if _SINKS.wants(Level.WARNING):
            emit("fleet.store_error", self._label, Level.WARNING, now, {
                "operation": exc.operation,
                "error.type": type(cause).__qualname__ if cause is not None else type(exc).__qualname__,
                "unavailable": exc.unavailable,
            })

    def accepted(self) -> None:
        """A policy used a reply: the end of an outage, if one was under way (``fleet.store_recovered``
        with its length, counted in ``stoic.fleet.store.recoveries``). A reply of the wrong shape is
        reported instead (:meth:`report`), so a store answering nothing usable stays in its outage."""
        since = self._failing_since
        if since is not None:
            self._failing_since = None
            now = self._clock.now_ns()
            if _metrics.state.enabled:
                _metrics.count_shared("fleet", self._label, ("stoic.fleet.store.recoveries",))
            if _SINKS.wants(Level.INFO):
                emit("fleet.store_recovered", self._label, Level.INFO, now, {"outage": (now - since) / 1e9})

    async def aclose(self) -> None:
        """Close the clients this store built from a URL (a client passed in stays the caller's)."""
        idle, self._idle = self._idle, []
        self._held = 0
        if self._owns_clients:
            if self._async is not None:
                await self._async.aclose()
            if self._sync is not None:
                self._sync.close()
        else:
            if self._async is not None and not self._cluster and self._loop is asyncio.get_running_loop():
                for conn in idle:
                    await self._async.connection_pool.release(conn)
            if self._sync_pool is not None:
                self._sync_pool.disconnect()  # (the store's own, beside a sync client passed in)

    @property
    def _owns_clients(self) -> bool:
        return self._async is not None and self._sync is not None

    @property
    def cluster(self) -> bool:
        """True when the store's client is a Redis Cluster client."""
        return self._cluster


__all__ = ["RedisStore", "StoreError", "check_key_part"]
