"""Hostile review of the adaptive throttle and the adaptive bulkheads (seed 003): what they
have learnt about a failing dependency must survive the places that forget policies."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

import stoic
from stoic import AdaptiveThrottle, Keyed, Throttled
from stoic.keyed import at_rest
from stoic.testing import VirtualClock, seeded


async def _down() -> None:
    raise ConnectionError("down")


async def _up() -> str:
    return "ok"


async def test_a_keyed_throttle_that_is_shedding_is_not_at_rest_and_not_evicted(clock: VirtualClock) -> None:
    # A throttle shedding for a failing host is what an open breaker is for a breaker: forgetting
    # it hands that host every call again until a fresh window fills. Keyed keeps a key that is
    # not at rest; a throttle is at rest once its shed probability is back to 0.
    hosts = Keyed(AdaptiveThrottle, label="hosts", max_keys=2, idle_after=30.0, clock=clock)
    for _ in range(40):
        with contextlib.suppress(ConnectionError, Throttled):
            await hosts.execute("down", _down)
    shedding = hosts.get("down")
    assert shedding.probability > 0.5
    assert not at_rest(shedding)

    # Capacity: two more keys arrive; the LRU key at rest goes, never the shedding one.
    await clock.advance(1.0)
    await hosts.execute("b", _up)
    await hosts.execute("c", _up)
    assert hosts.get("down") is shedding
    assert "b" not in hosts

    # Idle: unused for idle_after (30 s), still inside its window (120 s): still shedding, kept.
    await clock.advance(31.0)
    assert shedding.probability > 0.5
    hosts.sweep()
    assert hosts.get("down") is shedding

    # Once its window has rolled past the outage it sheds nothing: at rest, and may go.
    await clock.advance(130.0)
    assert shedding.probability == 0.0
    assert at_rest(shedding)
    assert hosts.sweep() >= 1
    assert "down" not in hosts


async def test_http_clients_timeouts_and_connection_failures_are_evidence_for_the_adaptive_policies(
        clock: VirtualClock) -> None:
    # httpx's ConnectError / ReadTimeout and aiohttp's ServerDisconnectedError are neither
    # ConnectionError nor TimeoutError: a throttle counted a dead host's every refusal as
    # accepted (never shedding), and an adaptive bulkhead took every httpx timeout for a fast
    # failure (never backing off), also as stages of stoic's own httpx transport, whose docs call
    # them failures.
    httpx = pytest.importorskip("httpx")
    from stoic.httpx import AsyncResilientTransport

    def refused(request: Any) -> Any:
        raise httpx.ConnectError("connection refused", request=request)

    def timed_out(request: Any) -> Any:
        clock._set_now(clock.now_ns() + 200_000_000)  # each attempt takes 0.2 s, then times out
        raise httpx.ReadTimeout("read timed out", request=request)

    throttle = AdaptiveThrottle(label="dead-host", clock=clock)
    aimd = stoic.AdaptiveBulkhead(latency_threshold=1.0, max_concurrent=20, cooldown=0.1, label="aimd", clock=clock)
    gradient = stoic.GradientBulkhead(max_concurrent=20, label="gradient", clock=clock)
    for policy, handler in ((throttle, refused), (aimd, timed_out), (gradient, timed_out)):
        transport = AsyncResilientTransport(httpx.MockTransport(handler), stages=[policy])
        async with httpx.AsyncClient(transport=transport) as client:
            with seeded(3):
                for _ in range(60):
                    with contextlib.suppress(httpx.TransportError, Throttled):
                        await client.get("http://dependency.example/")
    assert throttle.accepts == 0 and throttle.probability == pytest.approx(0.9)
    assert aimd.limit < 20 and gradient.limit < 20

    # The same kinds, raised directly (no stoic integration imported for them), and the one
    # classifier that judges them for the throttle and for retry.
    aiohttp = pytest.importorskip("aiohttp")
    for error in (httpx.ConnectError("refused"), httpx.PoolTimeout("pool"), httpx.RemoteProtocolError("closed"),
                  aiohttp.ServerDisconnectedError(), aiohttp.ClientOSError()):
        assert stoic.RetryClassifier.transient_only(error) == stoic.RetryDecision.RETRY, error
    for error in (httpx.UnsupportedProtocol("ftp://"), httpx.LocalProtocolError("bad header"),
                  aiohttp.ClientResponseError(None, (), status=400)):  # type: ignore[arg-type]
        assert stoic.RetryClassifier.transient_only(error) == stoic.RetryDecision.STOP, error


@pytest.mark.parametrize(("policy", "kwargs", "name"), [
    (AdaptiveThrottle, {"window": 1e-10}, "window"),
    (stoic.AdaptiveBulkhead, {"latency_threshold": 4e-10, "max_concurrent": 4}, "latency_threshold"),
    (stoic.AdaptiveBulkhead, {"latency_threshold": 0.1, "max_concurrent": 4, "cooldown": 1e-12}, "cooldown"),
    (stoic.GradientBulkhead, {"max_concurrent": 4, "queue_limit": 2, "queue_target": 1e-10}, "queue_target"),
])
def test_a_positive_duration_below_a_nanosecond_is_refused_with_the_range_it_misses(
        policy: Any, kwargs: dict[str, Any], name: str) -> None:
    # "window must be > 0 seconds, got 1e-10" contradicted itself: 1e-10 is > 0. Durations are
    # kept in whole nanoseconds, so the range a value misses there is "at least 1 ns".
    with pytest.raises(ValueError, match=rf"^{name} must be > 0 seconds \(at least 1 ns\), got ") as caught:
        policy(label="tiny", **kwargs)
    assert repr(kwargs[name]) in str(caught.value)


def test_a_certificate_the_client_refused_is_not_transient() -> None:
    # A certificate that fails verification fails the same way on every attempt: retrying it (or
    # counting it against the dependency's load) only delays the error a human has to fix. httpx
    # raises it as a ConnectError caused by ssl's error; aiohttp as a connection error that is one.
    import ssl

    httpx = pytest.importorskip("httpx")
    aiohttp = pytest.importorskip("aiohttp")
    from aiohttp.client_reqrep import ConnectionKey

    def httpx_certificate_error() -> BaseException:
        try:
            try:
                raise ssl.SSLCertVerificationError(1, "certificate verify failed")
            except ssl.SSLError as low:
                raise httpx.ConnectError(str(low)) from low
        except httpx.ConnectError as error:
            return error

    key = ConnectionKey("api.example", 443, True, True, None, None, None)
    refused = aiohttp.ClientConnectorCertificateError(key, ssl.SSLCertVerificationError("certificate verify failed"))
    for error in (httpx_certificate_error(), refused):
        assert stoic.RetryClassifier.transient_only(error) == stoic.RetryDecision.STOP, error
    assert stoic.RetryClassifier.transient_only(httpx.ConnectError("refused")) == stoic.RetryDecision.RETRY


async def test_an_operation_called_with_arguments_it_does_not_take_is_not_counted(clock: VirtualClock) -> None:
    # The misuse rule every policy shares (stoic._errors.misused): the call site's bug, which
    # never reached the dependency, so it is neither a request nor an accept.
    throttle = AdaptiveThrottle(label="misused", clock=clock)

    async def fetch(user_id: int) -> int:
        return user_id

    for _ in range(5):
        with pytest.raises(TypeError, match="takes 1 positional argument"):
            await throttle.execute(fetch, 1, 2)  # type: ignore[call-arg]
    assert (throttle.requests, throttle.accepts) == (0, 0)
    assert await throttle.execute(fetch, 3) == 3
    assert (throttle.requests, throttle.accepts) == (1, 1)
