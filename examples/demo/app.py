"""The traced demo service.

Starts the scripted dependency (:mod:`examples.demo.dependency`) in its own process, then runs a
few concurrent workers that call it over HTTP through httpx clients whose transport is
:class:`stoic.httpx.AsyncResilientTransport`: the resilience lives in the client, keyed by route
(``GET /work``, ``GET /search``), and every call site is a plain ``client.get``:

    with_fallback(  client.get("/work")  )   under the caller's deadline, the client's transport running
        Retrying -> CircuitBreaker -> AdaptiveThrottle -> RateLimiter -> AdaptiveBulkhead (AIMD) -> attempt timeout

(a stale answer when the breaker or the throttle refuses), and two readers whose client hedges
``GET /search`` (a read with a slow tail) with an adaptive :class:`stoic.Hedge` through a
breaker and a fixed :class:`stoic.Bulkhead`. stoic's events go to OpenTelemetry (span events)
and structlog; the ``stoic.*`` metrics are read from the policies when Prometheus scrapes. The
admin endpoint (the control plane) is served on loopback. The breaker's ``state_changes()``
stream is printed live; a summary table closes the run.

The story, at ``--time-scale 1`` (36 s): the dependency is healthy for 6 s, answers 503 for 9 s,
answers slowly for 9 s, then recovers. The breaker is tuned to tell it in that time: a 5 s
window, 5 calls minimum, a fixed 3 s open period, 0.3 s slow-call duration. ``--duration``
alone scales the story to fit; ``--serve`` keeps everything running (dependency recovered)
until Ctrl-C, for Prometheus and the Grafana dashboards; ``--repeat`` replays the story in a loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import signal
import statistics
import sys
import time
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import stoic_opentelemetry
import structlog
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry, start_http_server
from rich.console import Console
from rich.table import Table
from rich.text import Text
from stoic_structlog import StructlogSink

import stoic
from stoic import CircuitBreaker, ControlPlane, OpenDuration, TimeWindow
from stoic.admin import serve_admin
from stoic.httpx import AsyncResilientTransport, by_route

from .dependency import Phase, format_phases

ROOT = Path(__file__).resolve().parents[2]
NO_POLICY = stoic.Pipeline()  # with_fallback's policy: the stack is in the client's transport

# The story at time scale 1; the last phase lasts until the end of the run.
STORY: tuple[Phase, ...] = (Phase("healthy", 6.0), Phase("failing", 9.0), Phase("slow", 9.0), Phase("recovered", None))
STORY_SECONDS = 36.0  # long enough after "recovered" begins for a probe to close the breaker and stay closed
MIN_SCALE = 0.2  # below this, loopback HTTP latency is no longer small next to the slow-call duration
DEFAULT_METRICS_PORT = 9464  # the OpenTelemetry Prometheus exporter's customary port (used with --serve)

# How a retried call can end other than by success (the catalog's retry.* events).
_RETRY_ENDS = frozenset({"retry.exhausted", "retry.budget_exhausted", "retry.deadline_skip", "retry.permanent",
                         "retry.defect", "retry.nested"})

STATE_STYLE = {"closed": "green", "open": "bold red", "half_open": "yellow"}


SEARCH_SLOTS, SEARCH_BURST = 3, 5  # the search bulkhead's slots; reads sent at once in a burst

WORK, SEARCH = "GET /work", "GET /search"  # the keys: one policy of each family per route
_ROUTES = by_route("/work", "/search")


def route_key(request: httpx.Request) -> str:
    """``"GET /work"``: :func:`stoic.httpx.by_route` without the host part (each client talks to one
    dependency, whose port changes every run: labels stay the same from run to run)."""
    return _ROUTES(request).split(" ", 1)[1]


class AttemptTimeout(httpx.AsyncBaseTransport):
    """The innermost stage: each attempt (up to its response headers) inside ``stoic.timeout``.

    An httpx transport wrapping the one that sends, so the policies above it see a timed-out
    attempt as a ``DeadlineExceeded`` (a timeout the breaker counts as a failure, the retry
    retries, the adaptive bulkhead and the throttle take as a drop) rather than as httpx's own
    ``ReadTimeout``, which none of them could tell from any other transport error.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport, seconds: float, *, label: str) -> None:
        self._inner, self._seconds, self._label = inner, seconds, label

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        async with stoic.timeout(self._seconds, label=self._label):
            return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Tuning:
    """Every duration of the story, scaled together so the same transitions happen in less time."""

    scale: float

    repeat: bool = False

    @property
    def phases(self) -> list[Phase]:
        """The script, scaled; repeating, the recovered phase lasts until the story's end, then it restarts."""
        tail = STORY_SECONDS - sum(p.seconds or 0.0 for p in STORY) if self.repeat else None
        phases = []
        for phase in STORY:
            seconds = phase.seconds if phase.seconds is not None else tail
            phases.append(Phase(phase.name, None if seconds is None else seconds * self.scale))
        return phases

    def breakers(self, label: str) -> stoic.Keyed[CircuitBreaker]:
        """One breaker per route (``inventory-api:GET /work``, ``inventory-api:GET /search``)."""
        s = self.scale
        return stoic.Keyed(
            CircuitBreaker, label=label,
            window=TimeWindow(5.0 * s),
            minimum_calls=5,
            failure_rate_threshold=0.5,
            slow_call_duration=0.3 * s,
            slow_call_rate_threshold=0.8,
            open_duration=OpenDuration.fixed(3.0 * s, jitter=0.2),
            half_open_probes=1,
            half_open_timeout=5.0 * s,
        )

    def retrying(self) -> stoic.Retrying:
        # The standard classifier, as the transport expects: a 5xx (its Retry-After honoured), a
        # transport error and a timed-out attempt are retried; a refusal is retried after its
        # retry_after when the caller's deadline leaves room for it, and skipped otherwise.
        return stoic.Retrying(stoic.Schedule.fixed(0.05 * self.scale).attempts(2), label="inventory-retry")

    def throttles(self) -> stoic.Keyed[stoic.AdaptiveThrottle]:
        # Sheds locally once more than half the requests of the last 2 s failed (k=2): early in
        # the failing phase, while the breaker's 5 s window still holds the healthy calls.
        return stoic.Keyed(stoic.AdaptiveThrottle, label="inventory-throttle", k=2.0, min_throughput=10,
                           window=2.0 * self.scale)

    def limiters(self) -> stoic.Keyed[stoic.RateLimiter]:
        # Below what four workers ask for when the dependency is fast: some calls wait, a few are refused.
        return stoic.Keyed(stoic.RateLimiter, label="inventory-limiter", rate=35, per=1.0, burst=3, queue_limit=1)

    def adaptive_bulkheads(self) -> stoic.Keyed[stoic.AdaptiveBulkhead]:
        # AIMD on latency: four calls at a time while answers come in under the slow-call
        # duration; each slow or timed-out answer takes a quarter off (at most once per
        # cooldown); a queue of two whose waits are shed when they stay above 50 ms (CoDel).
        s = self.scale
        return stoic.Keyed(stoic.AdaptiveBulkhead, label="inventory-bulkhead", latency_threshold=0.3 * s,
                           max_concurrent=4, min_concurrent=1, backoff_ratio=0.75, cooldown=0.5 * s,
                           queue_limit=2, queue_target=0.05 * s, queue_interval=0.2 * s)

    def search_bulkheads(self) -> stoic.Keyed[stoic.Bulkhead]:
        # Three attempts at a time for two hedging readers (up to four attempts): a hedge is
        # sometimes refused (bulkhead_full), and the primary attempt goes on. The bursts of
        # SEARCH_BURST reads at once always overfill it, so every run shows its refusals.
        return stoic.Keyed(stoic.Bulkhead, label="search-bulkhead", max_concurrent=SEARCH_SLOTS, queue_limit=0)

    @property
    def burst_every(self) -> float:
        return 3.0 * self.scale  # the first burst after one second (scaled), then this often

    def hedge(self) -> stoic.Hedge:
        return stoic.Hedge(0.03 * self.scale, label="search-hedge", quantile=0.9, window=50,
                           budget=stoic.RetryBudget.named("search-hedge", ratio=0.5, reserve_per_second=20))

    @property
    def attempt_timeout(self) -> float:
        return 0.56 * self.scale  # the slow phase's answers take 0.5-0.6 s: about half time out

    @property
    def call_deadline(self) -> float:
        return 1.5 * self.scale  # the caller's budget for one call: two attempts and a short wait

    @property
    def retry_after_cap(self) -> float:
        # The longest Retry-After honoured inside a request: the dependency's "Retry-After: 1"
        # on a 503 is clamped to this (a caller with a 1.5 s budget cannot wait a second).
        return 0.1 * self.scale

    @property
    def latency(self) -> float:
        return 0.01 * self.scale

    @property
    def slow_latency(self) -> float:
        return 0.5 * self.scale  # well past slow_call_duration (0.3 s)

    @property
    def request_timeout(self) -> float:
        return 2.0 * self.scale


@dataclass
class Stats:
    """What the workers saw, for the summary."""

    calls: int = 0
    successes: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    rejections: Counter[str] = field(default_factory=Counter)  # by RejectionReason
    fallbacks: Counter[str] = field(default_factory=Counter)  # by the refusal's reason
    searches: int = 0
    bursts: int = 0
    burst_refused: Counter[str] = field(default_factory=Counter)  # by RejectionReason
    slow: int = 0
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=200_000))
    transitions: list[tuple[float, str, str]] = field(default_factory=list)
    time_in: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    limits: list[int] = field(default_factory=list)  # the adaptive bulkhead's limit, sampled
    probabilities: list[float] = field(default_factory=list)  # the throttle's, sampled


class SpanTally(SpanExporter):
    """Counts finished spans and keeps the newest few that carry stoic span events.

    Stands in for a real exporter (OTLP, for instance): the demo shows that span events land on
    the call's span without needing a collector, and it never grows without bound.
    """

    def __init__(self) -> None:
        self.spans = 0
        self.with_events = 0
        self.event_names: Counter[str] = Counter()
        self.first_trip: ReadableSpan | None = None  # the call whose recording opened the breaker

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self.spans += 1
            names = [e.name for e in span.events]
            if names:
                self.with_events += 1
                self.event_names.update(names)
                if self.first_trip is None and "breaker.opened" in names:
                    self.first_trip = span
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _short(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


class Demo:
    def __init__(self, args: argparse.Namespace, console: Console) -> None:
        self.args = args
        self.console = console
        self.tuning = Tuning(args.time_scale, repeat=args.repeat)
        self.stats = Stats()
        self.stop = asyncio.Event()
        self.t0 = time.monotonic()
        self.dependency: asyncio.subprocess.Process | None = None
        self.base_url = ""
        self.client: httpx.AsyncClient | None = None
        self.state = "closed"  # as last reported by state_changes() (reading .state could move it)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def line(self, message: str | Text, style: str = "") -> None:
        stamp = Text(f"{self.elapsed():7.2f}s  ", style="dim")
        body = message if isinstance(message, Text) else Text(message, style=style)
        self.console.print(stamp + body, highlight=False, soft_wrap=True)

    # --- the dependency process -------------------------------------------------------------

    async def start_dependency(self) -> None:
        t = self.tuning
        self.dependency = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "examples.demo.dependency",
            "--phases", format_phases(t.phases), "--port", str(self.args.port),
            "--latency", f"{t.latency:g}", "--slow-latency", f"{t.slow_latency:g}", "--exit-on-stdin-eof",
            *(["--repeat"] if t.repeat else []),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
            # Its own session: a terminal's Ctrl-C reaches only the demo, which finishes the calls
            # in flight and then stops the dependency (rather than both dying at once and the
            # last calls failing as if the dependency had broken).
            start_new_session=True,
        )
        assert self.dependency.stdout is not None
        try:
            first = await asyncio.wait_for(self.dependency.stdout.readline(), timeout=15)
        except TimeoutError:
            first = b""
        words = first.decode().split()
        if len(words) != 2 or words[0] != "LISTENING":
            raise RuntimeError(f"the dependency did not start (said {first!r})")
        self.base_url = f"http://127.0.0.1:{int(words[1])}"

    async def stop_dependency(self) -> None:
        proc, self.dependency = self.dependency, None
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # it exits on stdin EOF; SIGTERM as well, in case it is busy
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout=5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    # --- the service ------------------------------------------------------------------------

    async def worker(self, client: httpx.AsyncClient, tracer: Any) -> None:
        """``GET /work`` in a loop: the stack is in the client's transport; here, the caller's
        deadline and the fallback around the call."""
        stats, slow_after, t = self.stats, self.tuning.scale * 0.3, self.tuning

        def stale(error: Exception) -> Any:
            stats.fallbacks[str(getattr(error, "reason", type(error).__name__))] += 1
            return None  # a stale answer from a cache, in a real service

        def known_bad(error: Exception) -> bool:
            # The breaker or the throttle refused: the dependency is known to be failing.
            return isinstance(error, (stoic.CircuitOpen, stoic.Throttled))

        while not self.stop.is_set():
            with tracer.start_as_current_span(WORK, kind=SpanKind.CLIENT) as span:
                span.set_attribute("server.address", "127.0.0.1")
                started = time.perf_counter()
                try:
                    async with stoic.timeout(t.call_deadline, label="inventory-call"):
                        response = await stoic.with_fallback(NO_POLICY, client.get, "/work",
                                                             label="inventory-fallback", fallback=stale,
                                                             should_handle=known_bad)
                except stoic.DeadlineExceeded as exc:  # an attempt timeout, or the caller's deadline
                    self._failed(started, slow_after, type(exc).__name__, span)
                except stoic.Rejected as exc:  # the limiter or the bulkhead said no
                    stats.rejections[str(exc.reason)] += 1
                    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                except httpx.HTTPError as exc:
                    self._failed(started, slow_after, type(exc).__name__, span)
                else:
                    if response is not None:  # None: the fallback answered
                        if response.status_code >= 500:  # the last attempt's response, retries over
                            self._failed(started, slow_after, f"HTTP {response.status_code}", span)
                        else:
                            stats.calls += 1
                            stats.successes += 1
                            self._timed(started, slow_after)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=self.args.pace)

    def _failed(self, started: float, slow_after: float, what: str, span: Any) -> None:
        self.stats.calls += 1
        self.stats.failures[what] += 1
        self._timed(started, slow_after)
        span.set_status(Status(StatusCode.ERROR, what))

    async def reader(self, client: httpx.AsyncClient, tracer: Any) -> None:
        """Reads of the endpoint with a slow tail: the client's transport hedges them."""
        while not self.stop.is_set():
            with tracer.start_as_current_span(SEARCH, kind=SpanKind.CLIENT), \
                    contextlib.suppress(httpx.HTTPError, stoic.Rejected):
                (await client.get("/search")).json()
                self.stats.searches += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=self.args.pace)

    async def burster(self, client: httpx.AsyncClient, tracer: Any) -> None:
        """Now and then, SEARCH_BURST reads at once: more than the search bulkhead's slots, and
        it has no queue, so at least SEARCH_BURST - SEARCH_SLOTS of them are refused at once
        (``bulkhead_full``), whatever the timing of the readers' own calls."""

        async def read() -> None:
            with tracer.start_as_current_span(SEARCH, kind=SpanKind.CLIENT) as span, \
                    contextlib.suppress(httpx.HTTPError):
                try:
                    (await client.get("/search")).json()
                except stoic.Rejected as exc:
                    self.stats.burst_refused[str(exc.reason)] += 1
                    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                else:
                    self.stats.searches += 1

        pause = 1.0 * self.tuning.scale
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=pause)
            if self.stop.is_set():
                return
            self.stats.bursts += 1
            await asyncio.gather(*(read() for _ in range(SEARCH_BURST)))
            pause = self.tuning.burst_every

    def _timed(self, started: float, slow_after: float) -> None:
        took = time.perf_counter() - started
        self.stats.latencies.append(took)
        if took > slow_after:
            self.stats.slow += 1

    async def watch_breaker(self, breaker: CircuitBreaker, changes: Any) -> None:
        previous, since = str(breaker.state), self.elapsed()
        async for state in changes:
            now, new = self.elapsed(), str(state)
            self.stats.time_in[previous] += now - since
            self.stats.transitions.append((now, previous, new))
            arrow = Text.assemble(
                (f"breaker {breaker.label}: ", "bold"), (previous, STATE_STYLE.get(previous, "")), " → ",
                (new, STATE_STYLE.get(new, "")),
            )
            self.line(arrow)
            previous, since = new, now
            self.state = new

    async def show_status(self) -> None:
        """On a terminal only: a status line under the log, refreshed with the running counts."""
        s = self.stats
        with self.console.status("", spinner="dots") as status:
            while not self.stop.is_set():
                status.update(
                    f"{self.elapsed():6.1f}s  breaker {self.state}  calls {s.calls}  ok {s.successes}  "
                    f"failed {sum(s.failures.values())}  rejected {sum(s.rejections.values())}"
                    + ("  (Ctrl-C to stop)" if self.args.serve else ""))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=0.2)

    async def watch_dependency(self, client: httpx.AsyncClient) -> None:
        """Poll the dependency's phase directly (not through the breaker), to narrate the script."""
        seen = ""
        while not self.stop.is_set():
            with contextlib.suppress(httpx.HTTPError, ValueError):
                phase = (await client.get("/phase")).json()["phase"]
                if phase != seen:
                    what = {"healthy": "answers in ~%s", "failing": "answers HTTP 503",
                            "slow": "answers after ~%s", "recovered": "answers in ~%s again"}[phase]
                    t = self.tuning
                    detail = what % _ms(t.slow_latency if phase == "slow" else t.latency) if "%" in what else what
                    self.line(f"dependency is {phase}: {detail}", style="dim cyan")
                    seen = phase
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=0.05)

    async def sample(self, bulkheads: stoic.Keyed[stoic.AdaptiveBulkhead],
                     throttles: stoic.Keyed[stoic.AdaptiveThrottle]) -> None:
        """The adaptive bulkhead's limit and the throttle's probability, every 50 ms, for the summary
        (read through the families: a retune from the admin endpoint replaces the policies)."""
        while not self.stop.is_set():
            self.stats.limits.append(bulkheads.get(WORK).limit)
            self.stats.probabilities.append(throttles.get(WORK).probability)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=0.05)

    async def run(self) -> int:
        args, console = self.args, self.console
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self.stop.set)

        resource = Resource.create({"service.name": "stoic-demo"})
        tracer_provider = TracerProvider(resource=resource)
        tally = SpanTally()
        tracer_provider.add_span_processor(SimpleSpanProcessor(tally))
        registry = CollectorRegistry(auto_describe=True)
        meter_provider = MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader(registry=registry)])
        metrics_port = args.metrics_port if args.metrics_port is not None else (
            DEFAULT_METRICS_PORT if args.serve else 0)
        metrics_server, metrics_thread = start_http_server(metrics_port, addr="127.0.0.1", registry=registry)
        metrics_url = f"http://127.0.0.1:{metrics_server.server_port}/metrics"

        # Span events at INFO (transitions, rejections, retries, hedges); metrics from the recorders,
        # the histograms served from the same registry as the OpenTelemetry Prometheus exporter's.
        instrumentation = stoic_opentelemetry.instrument(
            tracer_provider=tracer_provider, meter_provider=meter_provider, prometheus_registry=registry)
        # The terminal tells the breaker's story; the other decisions are in the spans and metrics.
        log_sink = StructlogSink(structlog.get_logger("stoic"), level=stoic.Level.INFO, event_names=(
            "breaker.opened", "breaker.half_open", "breaker.closed", "control.forced_open", "control.cleared",
            "control.retuned"))
        stoic.add_sink(log_sink)
        t = self.tuning
        # The policies, as families keyed by route; the breakers' family serves both clients.
        breakers = t.breakers(args.label)
        throttles, limiters, bulkheads = t.throttles(), t.limiters(), t.adaptive_bulkheads()
        search_bulkheads, hedge = t.search_bulkheads(), t.hedge()
        # Built now, so the stream is subscribed to before any call (it never replays the current
        # state) and the other kinds' gauges exist from the first scrape (a breaker's state gauge
        # exists from its first call: docs/metrics.md).
        breaker = breakers.get(WORK)
        for family, key in ((breakers, SEARCH), (throttles, WORK), (limiters, WORK), (bulkheads, WORK),
                            (search_bulkheads, SEARCH)):
            family.get(key)
        # The control plane, served on loopback (no token: loopback only): docs/demo.md shows
        # force-opening the breaker with curl while the story runs.
        control = ControlPlane()
        for family in (breakers, throttles, limiters, bulkheads, search_bulkheads):
            control.register(family)
        control.register(hedge)
        admin_port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        tracer = tracer_provider.get_tracer("examples.demo")

        workers: list[asyncio.Task[None]] = []
        watchers: list[asyncio.Task[None]] = []
        admin = asyncio.create_task(serve_admin(control, port=args.admin_port, started=admin_port.set_result))
        try:
            await self.start_dependency()
            admin_url = f"http://127.0.0.1:{await asyncio.wait_for(asyncio.shield(admin_port), timeout=15)}"
            story = format_phases(self.tuning.phases).replace(",", " → ") + (" → …" if args.repeat else "")
            s = self.tuning.scale
            console.print(Text.assemble(("stoic demo", "bold"), f"  (time scale {s:g}; ",
                                        f"{'until Ctrl-C' if args.serve else f'{args.duration:g} s'})"))
            console.print(f"  dependency  {self.base_url}/work  script: {story}", highlight=False)
            console.print(f"  metrics     {metrics_url}", highlight=False)
            console.print(f"  admin       {admin_url}/policies  (docs/demo.md: force the breaker open with curl)",
                          highlight=False)
            console.print(f"  breaker     {breaker.label!r}: window {5 * s:g} s, minimum 5 calls, "
                          f"open {3 * s:g} s, slow after {0.3 * s:g} s; {args.workers} workers", highlight=False)
            console.print(f"  GET /work   with_fallback(client.get) within {t.call_deadline:g} s; the transport: "
                          f"retry → breaker → throttle → rate limiter 35/s → AIMD bulkhead ≤4 → "
                          f"attempt timeout {t.attempt_timeout:g} s", highlight=False)
            console.print(f"  GET /search the transport: hedge (adaptive, p90) → breaker → bulkhead {SEARCH_SLOTS}; "
                          f"2 readers, and a burst of {SEARCH_BURST} reads every {t.burst_every:g} s", highlight=False)
            if args.serve:
                after = "the story replays" if args.repeat else "after the story the dependency stays healthy"
                console.print(f"  serving until Ctrl-C; {after} (docs/demo.md: Prometheus and Grafana)",
                              highlight=False)
            console.rule(style="dim")
            self.t0 = time.monotonic()
            # Room for every worker, the readers' hedged pairs and the phase watcher.
            limits = httpx.Limits(max_connections=args.workers + 6, max_keepalive_connections=args.workers + 6)
            work_transport = AsyncResilientTransport(
                AttemptTimeout(httpx.AsyncHTTPTransport(limits=limits), t.attempt_timeout, label="inventory-attempt"),
                stages=[breakers, throttles, limiters, bulkheads], retry=t.retrying(), key=route_key,
                retry_after_cap=t.retry_after_cap)
            search_transport = AsyncResilientTransport(
                httpx.AsyncHTTPTransport(limits=limits), stages=[breakers, search_bulkheads], hedge=hedge,
                key=route_key)
            timeout = self.tuning.request_timeout
            async with httpx.AsyncClient(base_url=self.base_url, transport=work_transport, timeout=timeout) as work, \
                    httpx.AsyncClient(base_url=self.base_url, transport=search_transport, timeout=timeout) as search, \
                    httpx.AsyncClient(base_url=self.base_url, timeout=timeout) as plain:
                watchers.append(asyncio.create_task(self.watch_breaker(breaker, breaker.state_changes())))
                watchers.append(asyncio.create_task(self.watch_dependency(plain)))
                watchers.append(asyncio.create_task(self.sample(bulkheads, throttles)))
                workers.extend(asyncio.create_task(self.worker(work, tracer)) for _ in range(args.workers))
                workers.extend(asyncio.create_task(self.reader(search, tracer)) for _ in range(2))
                workers.append(asyncio.create_task(self.burster(search, tracer)))
                if console.is_terminal:
                    watchers.append(asyncio.create_task(self.show_status()))
                if args.serve:
                    await self.stop.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stop.wait(), timeout=args.duration)
                self.stop.set()
                await asyncio.gather(*workers)
                # Let the stream deliver what the last calls published, then stop watching.
                await asyncio.sleep(0)
                for task in watchers:
                    task.cancel()
                await asyncio.gather(*watchers, return_exceptions=True)
        finally:
            self.stop.set()
            for task in (*workers, *watchers):
                task.cancel()
            admin.cancel()
            await asyncio.gather(*workers, *watchers, admin, return_exceptions=True)
            await self.stop_dependency()
            stoic.remove_sink(log_sink)
            instrumentation.uninstrument()
            metrics_server.shutdown()
            metrics_server.server_close()
            metrics_thread.join(timeout=5)
            meter_provider.shutdown()
            tracer_provider.shutdown()

        final = str(breaker.state)
        self.stats.time_in[final] += self.elapsed() - (self.stats.transitions[-1][0] if self.stats.transitions else 0)
        console.rule(style="dim")
        console.print(self.summary(breaker.label, final, tally, bulkheads.get(WORK), throttles.get(WORK)))
        if self.stats.transitions:
            console.print(self.transition_table())
        return 0

    # --- the closing tables ------------------------------------------------------------------

    def summary(self, label: str, final: str, tally: SpanTally, bulkhead: stoic.AdaptiveBulkhead,
                throttle: stoic.AdaptiveThrottle) -> Table:
        s = self.stats
        latencies = list(s.latencies)
        seen = Counter(f"{a}→{b}" for _, a, b in s.transitions)
        events = tally.event_names

        def by(counts: Counter[str]) -> str:
            total = sum(counts.values())
            return f"{total}" + (f"  ({', '.join(f'{k} ×{v}' for k, v in counts.most_common())})" if total else "")

        table = Table(title=f"Summary: GET /work through the stack (breaker {label!r}), and the hedged GET /search",
                      title_justify="left", show_header=False)
        table.add_column("what", style="bold")
        table.add_column("value")
        table.add_row("calls answered",
                      f"{s.calls}  (a success or a failure; refusals and fallbacks below are not in it)")
        table.add_row("successes", str(s.successes))
        table.add_row("failures", by(s.failures))
        table.add_row("slow calls", str(s.slow))
        table.add_row("rejections", by(s.rejections)
                      + "  (what the caller got, after retries; each stage's own refusals are span events)")
        table.add_row("fallbacks", by(s.fallbacks) + "  (a stale answer: the breaker or the throttle refused)")
        table.add_row("hedged reads", f"{s.searches} reads, {events['hedge.started']} hedges started "
                                      f"(hedge.won ×{events['hedge.won']})")
        table.add_row("search bursts", f"{s.bursts} bursts of {SEARCH_BURST} reads at once into {SEARCH_SLOTS} "
                                       f"slots: refused {by(s.burst_refused)}")
        ends = ", ".join(f"{name.removeprefix('retry.')} ×{n}" for name, n in sorted(events.items())
                         if name in _RETRY_ENDS)
        table.add_row("retries", f"{events['retry.attempt_failed']} attempts retried, {events['retry.succeeded']} "
                                 f"calls then succeeded; ended by: {ends or 'nothing else'}")
        table.add_row("time open", f"{s.time_in['open']:.1f} s (half-open {s.time_in['half_open']:.1f} s)")
        table.add_row("latency p50", _ms(_percentile(latencies, 0.50)))
        table.add_row("latency p99", _ms(_percentile(latencies, 0.99)))
        table.add_row("transitions", ", ".join(f"{k} ×{v}" for k, v in seen.items()) or "none")
        table.add_row("final state", final)
        if s.limits:
            table.add_row("adaptive limit", f"{bulkhead.label!r}: {bulkhead.max_concurrent} at start, lowest "
                                            f"{min(s.limits)}, {bulkhead.limit} at the end "
                                            f"({events['bulkhead.limit_changed']} changes)")
        if s.probabilities:
            table.add_row("throttle", f"{throttle.label!r}: shed probability up to {max(s.probabilities):.2f}, "
                                      f"{throttle.probability:.2f} at the end ({events['throttle.rejected']} shed)")
        table.add_row("spans", f"{tally.spans} ({tally.with_events} with stoic span events)")
        table.add_row("span events", ", ".join(f"{k} ×{v}" for k, v in sorted(events.items())) or "none")
        if tally.first_trip is not None:
            span = tally.first_trip
            described = "; ".join(
                " ".join([e.name, *(f"{k}={_short(v)}" for k, v in (e.attributes or {}).items() if k != "stoic.label")])
                for e in span.events)
            trace_id = f"{span.context.trace_id:032x}" if span.context is not None else "?"
            table.add_row("tripping span", f"{span.name} trace {trace_id[:12]}…: {described}")
        return table

    def transition_table(self) -> Table:
        table = Table(title="Transitions, from breaker.state_changes()", title_justify="left", min_width=48)
        table.add_column("time", justify="right")
        table.add_column("from")
        table.add_column("to")
        for at, a, b in self.stats.transitions:
            table.add_row(f"{at:.2f} s", Text(a, style=STATE_STYLE.get(a, "")), Text(b, style=STATE_STYLE.get(b, "")))
        return table


def _configure_structlog(console: Console) -> None:
    """The application configures structlog (the adapter never does): key=value lines on stdout."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(colors=console.is_terminal, pad_event_to=18),
        ],
        # No file given: each logger takes sys.stdout when made, which is rich's while a status
        # line is live, so log lines print above it instead of through it.
        logger_factory=structlog.PrintLoggerFactory(),
        cache_logger_on_first_use=False,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m examples.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=None,
                        help=f"seconds to run (default: the story, {STORY_SECONDS:g} s × time scale; not with --serve)")
    parser.add_argument("--time-scale", type=float, default=None,
                        help=f"multiply every duration of the story (default 1, or duration / {STORY_SECONDS:g} "
                             f"when --duration is given; at least {MIN_SCALE})")
    parser.add_argument("--serve", action="store_true",
                        help="keep running (after the story the dependency stays healthy, unless --repeat) "
                             "until Ctrl-C, metrics on port "
                             f"{DEFAULT_METRICS_PORT} unless --metrics-port")
    parser.add_argument("--repeat", action="store_true",
                        help="replay the story in a loop (with --serve: fresh data for the dashboards)")
    parser.add_argument("--port", type=int, default=0, help="the dependency's port on 127.0.0.1 (default: free)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help=f"Prometheus endpoint port on 127.0.0.1 (default: free; {DEFAULT_METRICS_PORT} "
                             "with --serve)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent client workers (default 4)")
    parser.add_argument("--pace", type=float, default=0.05, help="each worker's pause between calls, s")
    parser.add_argument("--admin-port", type=int, default=0,
                        help="the admin endpoint's port on 127.0.0.1 (default: free)")
    parser.add_argument("--label", default="inventory-api",
                        help="the breakers' family label: each route's breaker is LABEL:GET /work, "
                             "LABEL:GET /search (stoic_label in metrics; the policy name for the admin endpoint)")
    args = parser.parse_args(argv)
    if args.serve and args.duration is not None:
        # --serve runs until Ctrl-C at the time scale given (1 by default): a duration would be
        # silently ignored, and with it the scaling --duration alone implies.
        parser.error("--duration does not apply with --serve (it runs until Ctrl-C); "
                     "shorten the story with --time-scale")
    if args.time_scale is None:
        args.time_scale = 1.0 if args.duration is None else args.duration / STORY_SECONDS
    if args.time_scale < MIN_SCALE:
        parser.error(f"--time-scale must be >= {MIN_SCALE} (with --duration alone: --duration >= "
                     f"{MIN_SCALE * STORY_SECONDS:g}); got {args.time_scale:g}")
    if args.duration is None:
        args.duration = STORY_SECONDS * args.time_scale
    if args.duration <= 0 or args.workers < 1 or args.pace < 0:
        parser.error("--duration must be > 0, --workers >= 1 and --pace >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="replace")  # a non-UTF-8 terminal gets "?" for an arrow, not a crash
    console = Console()
    _configure_structlog(console)
    try:
        return asyncio.run(Demo(args, console).run())
    except KeyboardInterrupt:
        return 130
