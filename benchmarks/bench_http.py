"""The httpx transport's added latency per request, against a bare httpx client on the same
local server (uvicorn in its own process on loopback), rows interleaved.

Rows: a bare ``httpx.AsyncClient``; the same client with ``AsyncResilientTransport`` holding a
keyed breaker (one per host); with the recommended stack (retry -> keyed breaker -> bulkhead);
and the blocking pair (``httpx.Client`` bare vs ``ResilientTransport`` with a keyed breaker).
Each round times ``CALLS`` requests of every row in turn; a row's figure is its median round.
Target (issue 14): the added latency under 3 % of a 1 ms loopback request (30 µs).

Run: ``.venv/bin/python -m benchmarks http`` (or ``python benchmarks/bench_http.py``).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import httpx

from stoic import Bulkhead, CircuitBreaker, Keyed, Retrying, Schedule
from stoic.httpx import AsyncResilientTransport, ResilientTransport

CALLS = 200
ROUNDS = 15

_SERVER = """
import uvicorn

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})

uvicorn.run(app, host="127.0.0.1", port=int(__import__("sys").argv[1]), log_level="warning",
            access_log=False, lifespan="off")
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_server() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the benchmark server did not start")


async def _async_rows(url: str) -> dict[str, httpx.AsyncClient]:
    breakers = Keyed(CircuitBreaker, label="bench")
    stack = AsyncResilientTransport(stages=[Keyed(CircuitBreaker, label="bench-stack"),
                                            Keyed(Bulkhead, label="bench-bh", max_concurrent=64)],
                                    retry=Retrying(Schedule.fixed(0.01).attempts(3), label="bench.retry"))
    return {
        "httpx.AsyncClient (bare)": httpx.AsyncClient(base_url=url),
        "+ transport, keyed breaker": httpx.AsyncClient(base_url=url,
                                                        transport=AsyncResilientTransport(stages=[breakers])),
        "+ retry, keyed breaker, bulkhead": httpx.AsyncClient(base_url=url, transport=stack),
    }


def _sync_rows(url: str) -> dict[str, httpx.Client]:
    return {
        "httpx.Client (bare)": httpx.Client(base_url=url),
        "+ sync transport, keyed breaker": httpx.Client(
            base_url=url, transport=ResilientTransport(stages=[Keyed(CircuitBreaker, label="bench-sync")])),
    }


async def _time_async(client: httpx.AsyncClient) -> float:
    start = time.perf_counter_ns()
    for _ in range(CALLS):
        (await client.get("/")).raise_for_status()
    return (time.perf_counter_ns() - start) / CALLS


def _time_sync(client: httpx.Client) -> float:
    start = time.perf_counter_ns()
    for _ in range(CALLS):
        client.get("/").raise_for_status()
    return (time.perf_counter_ns() - start) / CALLS


def _print(title: str, samples: dict[str, list[float]], baseline: str, calls: int = CALLS) -> None:
    medians = {name: statistics.median(values) for name, values in samples.items()}
    base = medians[baseline]
    print(f"\n## {title} (median of {ROUNDS} interleaved rounds of {calls} requests)")
    print(f"{'':<36}{'µs/request':>12}{'added µs':>10}{'added %':>9}")
    for name, ns in medians.items():
        added = ns - base
        print(f"{name:<36}{ns / 1000:>12.1f}{added / 1000:>10.1f}{added / base * 100:>8.1f}%")


class _Canned(httpx.AsyncBaseTransport):
    """An in-memory inner transport: isolates the CPU a wrapper adds from loopback noise."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"ok")


def _in_process() -> dict[str, list[float]]:
    request = httpx.Request("GET", "http://127.0.0.1:8000/")
    transports: dict[str, httpx.AsyncBaseTransport] = {
        "canned inner transport (bare)": _Canned(),
        "+ transport, keyed breaker": AsyncResilientTransport(_Canned(), stages=[Keyed(CircuitBreaker, label="m")]),
        "+ retry, keyed breaker, bulkhead": AsyncResilientTransport(
            _Canned(), stages=[Keyed(CircuitBreaker, label="ms"), Keyed(Bulkhead, label="mb", max_concurrent=64)],
            retry=Retrying(Schedule.fixed(0.01).attempts(3), label="bench.retry")),
    }

    async def run() -> dict[str, list[float]]:
        samples: dict[str, list[float]] = {name: [] for name in transports}
        for _ in range(ROUNDS + 1):  # the first round warms up
            for name, transport in transports.items():
                start = time.perf_counter_ns()
                for _ in range(CALLS * 10):
                    await transport.handle_async_request(request)
                samples[name].append((time.perf_counter_ns() - start) / (CALLS * 10))
        return {name: values[1:] for name, values in samples.items()}

    return asyncio.run(run())


def main() -> None:
    _print("in process: the CPU the async transport adds per request", _in_process(),
           "canned inner transport (bare)", CALLS * 10)
    proc, url = _start_server()
    try:
        async def run_async() -> dict[str, list[float]]:
            clients = await _async_rows(url)
            samples: dict[str, list[float]] = {name: [] for name in clients}
            for client in clients.values():  # warm up: connections made, code paths hot
                await _time_async(client)
            for _ in range(ROUNDS):
                for name, client in clients.items():
                    samples[name].append(await _time_async(client))
            for client in clients.values():
                await client.aclose()
            return samples

        _print("httpx async transport", asyncio.run(run_async()), "httpx.AsyncClient (bare)")
        sync_clients = _sync_rows(url)
        sync_samples: dict[str, list[float]] = {name: [] for name in sync_clients}
        timers: dict[str, Callable[[], float]] = {
            name: functools.partial(_time_sync, client) for name, client in sync_clients.items()}
        for timer in timers.values():
            timer()
        for _ in range(ROUNDS):
            for name, timer in timers.items():
                sync_samples[name].append(timer())
        for client in sync_clients.values():
            client.close()
        _print("httpx sync transport", sync_samples, "httpx.Client (bare)")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
