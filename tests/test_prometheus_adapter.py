"""stoic-prometheus: stoic's metrics in a prometheus_client registry, the same names, labels and
buckets as the OpenTelemetry adapter's table, read at scrape time."""

from __future__ import annotations

import gc
import logging

import pytest
import stoic_prometheus
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

import stoic
from stoic._metrics import DURATION_BUCKETS, METRICS


def test_every_metric_of_the_table_is_registered_under_its_prometheus_name() -> None:
    registry = CollectorRegistry()
    collector = stoic_prometheus.instrument(registry)
    try:
        breaker = stoic.CircuitBreaker(label="p1-breaker")
        breaker.call(lambda: None)
        text = generate_latest(registry).decode()
        for spec in METRICS:
            assert f"# TYPE {spec.prometheus_name.removesuffix('_total')}" in text, spec.name
        assert 'stoic_breaker_calls_total{outcome="success",stoic_label="p1-breaker"} 1.0' in text
        les = [f'le="{float(b)}"' for b in DURATION_BUCKETS]
        for le in [*les, 'le="+Inf"']:
            assert f'stoic_breaker_call_duration_seconds_bucket{{error_type="",{le},outcome="success",' in text, le
        assert 'stoic_breaker_state{state="closed",stoic_label="p1-breaker"} 1.0' in text
    finally:
        stoic_prometheus.uninstrument(collector, registry)
    assert "stoic_" not in generate_latest(registry).decode()


def test_the_default_registry_is_the_global_one_and_a_second_collector_is_refused() -> None:
    collector = stoic_prometheus.instrument()
    try:
        assert "stoic_breaker_state" in generate_latest(REGISTRY).decode()
        with pytest.raises(ValueError, match="Duplicated"):
            stoic_prometheus.instrument()
    finally:
        stoic_prometheus.uninstrument(collector)


def test_a_dropped_policy_is_gone_at_the_next_scrape() -> None:
    registry = CollectorRegistry()
    collector = stoic_prometheus.instrument(registry)
    try:
        limiter = stoic.RateLimiter(5, label="p3-limiter")
        assert 'stoic_ratelimiter_permits_available{stoic_label="p3-limiter"} 5.0' in generate_latest(registry).decode()
        del limiter
        gc.collect()
        assert "p3-limiter" not in generate_latest(registry).decode()
    finally:
        stoic_prometheus.uninstrument(collector, registry)


def test_a_failing_collection_never_breaks_the_scrape_and_is_reported_once(monkeypatch, caplog) -> None:
    registry = CollectorRegistry()
    collector = stoic_prometheus.instrument(registry)
    try:
        def broken() -> list[object]:
            raise RuntimeError("collector bug")

        monkeypatch.setattr(collector._collector, "collect", broken)
        with caplog.at_level(logging.ERROR, logger="stoic"):
            generate_latest(registry)
            generate_latest(registry)
        assert len([r for r in caplog.records if "collecting stoic metrics failed" in r.getMessage()]) == 1
    finally:
        stoic_prometheus.uninstrument(collector, registry)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="kinds"):
        stoic_prometheus.StoicCollector(kinds={"summary"})
    with pytest.raises(ValueError, match="max_labels"):
        stoic_prometheus.StoicCollector(max_labels=0)
    with pytest.raises(TypeError, match="max_labels"):
        stoic_prometheus.StoicCollector(max_labels="10")  # type: ignore[arg-type]
