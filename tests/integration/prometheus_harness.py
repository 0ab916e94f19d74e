"""Start a real Prometheus (the Debian package's binary) for integration tests, and query it.

Used by test_prometheus.py. Everything binds 127.0.0.1 on free ports, lives in a temporary
directory and is killed at the end, passed or failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_binary(name: str, package: str = "prometheus") -> str:
    """The binary's path; skip without it, except under CI (CI=true), where it must be there."""
    path = shutil.which(name)
    if path is None:
        reason = (f"{name} not found on PATH: install the Debian package "
                  f"(apt-get install -y --no-install-recommends {package}); .ci/run does")
        if in_ci():
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    return path


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time; always reaps it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Prometheus:
    """A running Prometheus on ``url``, scraping ``targets`` every second."""

    def __init__(self, binary: str, workdir: Path, targets: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / "prometheus.yml"
        self.log = workdir / "prometheus.log"
        self.config.write_text(render_config(targets), encoding="utf-8")
        self._log_file = self.log.open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT, cwd=workdir,
        )

    def close(self) -> None:
        try:
            stop_process(self.proc)
        finally:
            self._log_file.close()

    def logs(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.logs()}")
            with contextlib.suppress(OSError):
                if http_get(f"{self.url}/-/ready")[0] == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(f"prometheus not ready within {timeout} s:\n{self.logs()}")

    def wait_targets_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = self.api("targets")["data"]["activeTargets"]
            if last and all(t["health"] == "up" for t in last):
                return
            time.sleep(0.2)
        raise AssertionError(f"scrape targets not up within {timeout} s: {last}")

    def wait_scraping(self, timeout: float) -> None:
        """Until every target has been scraped once (up or down). Prometheus applies its first
        target set some five seconds after it is ready (the scrape manager's reload tick): a
        process started before that loses its first seconds of samples."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = self.api("targets")["data"]["activeTargets"]
            if last and all(t["health"] != "unknown" for t in last):
                return
            time.sleep(0.2)
        raise AssertionError(f"scrape targets never scraped within {timeout} s: {last}")

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        status, body = http_get(url, timeout=10)
        payload = json.loads(body)
        if status != 200 or payload.get("status") != "success":
            raise AssertionError(f"GET {url} -> {status}: {payload}")
        return payload

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result list (``resultType`` vector or scalar is normalised to a list)."""
        data = self.api("query", query=expr)["data"]
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        """A range query's matrix: one ``{"metric": ..., "values": [[t, "v"], ...]}`` per series."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")["data"]
        return list(data["result"])

    def wait_for(self, expr: str, predicate: Any, timeout: float, what: str) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``predicate(result)`` is true; AssertionError naming ``what`` if never."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if predicate(result):
                return result
            time.sleep(0.5)
        raise AssertionError(f"{what}: {expr} never satisfied within {timeout} s; last result {result}")


def render_config(targets: list[str]) -> str:
    """A minimal prometheus.yml scraping ``targets`` (host:port) every second."""
    lines = [
        "global:",
        "  scrape_interval: 1s",
        "  scrape_timeout: 1s",
        "  evaluation_interval: 1s",
        "scrape_configs:",
        "  - job_name: stoic-demo",
        "    static_configs:",
        "      - targets: [" + ", ".join(f'"{t}"' for t in targets) + "]",
    ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def running_prometheus(binary: str, workdir: Path, targets: list[str]) -> Iterator[Prometheus]:
    prometheus = Prometheus(binary, workdir, targets)
    try:
        yield prometheus
    finally:
        prometheus.close()
