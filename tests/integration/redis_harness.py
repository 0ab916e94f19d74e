"""Start a real Redis (the Debian package's ``redis-server``) for stoic.fleet's integration tests.

It binds 127.0.0.1 on a free port, keeps nothing on disk (``--save "" --appendonly no``, its
working directory a temporary one) and is killed at the end, passed or failed. Without the
binary the tests skip with the reason, except under CI (CI=true), where they fail.

:class:`RedisClusterServer` starts three ``redis-server --cluster-enabled yes`` nodes the same way
(each in its own temporary directory) and joins them with ``redis-cli --cluster create``, every
slot served by one of the three primaries (no replicas).
"""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from prometheus_harness import free_port, require_binary, stop_process

_labels = itertools.count()


def fresh(name: str) -> str:
    """A key prefix (a policy label) that no other test, nor an earlier run on the same server, uses."""
    return f"{name}-{next(_labels)}-{time.monotonic_ns()}"


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisServer:
    """A running ``redis-server`` on 127.0.0.1:``port`` in ``workdir``; :meth:`kill` SIGKILLs it,
    :meth:`start` starts it again on the same port (empty: nothing is persisted)."""

    def __init__(self, workdir: Path) -> None:
        self.binary = require_binary("redis-server", package="redis-server")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[Any] | None = None
        self.start()

    def start(self) -> None:
        log = (self.workdir / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--daemonize", "no", "--loglevel", "warning"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.workdir / 'redis.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not answer PING within 10 s")

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, without closing connections politely."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


class RedisClusterServer:
    """Three cluster-enabled ``redis-server`` nodes on 127.0.0.1, joined by ``redis-cli --cluster
    create ... --cluster-replicas 0``; ``ports`` are theirs, :meth:`stop` kills them all."""

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
        self.binary = require_binary("redis-server", package="redis-server")
        self.cli = require_binary("redis-cli", package="redis-tools")
        self.workdir = workdir
        self.procs: list[subprocess.Popen[Any]] = []
        self.ports: list[int] = []
        try:
            for n in range(nodes):
                self._start_node(n)
            self._join()
        except BaseException:
            self.stop()
            raise

    def _start_node(self, n: int) -> None:
        port = _cluster_port()
        home = self.workdir / f"node{n}"
        home.mkdir()
        log = (home / "redis.log").open("ab")
        proc = subprocess.Popen(
            [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(home), "--daemonize", "no", "--loglevel", "warning", "--cluster-enabled", "yes",
             "--cluster-config-file", str(home / "nodes.conf"), "--cluster-node-timeout", "5000"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        self.ports.append(port)
        deadline = time.monotonic() + 10.0
        while not _answers_ping(port):
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {proc.returncode}; see {home / 'redis.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError("a cluster node did not answer PING within 10 s")
            time.sleep(0.02)

    def _join(self) -> None:
        subprocess.run(
            [self.cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports), "--cluster-replicas", "0",
             "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            states = [subprocess.run([self.cli, "-p", str(p), "cluster", "info"], capture_output=True, text=True,
                                     timeout=5).stdout for p in self.ports]
            if all("cluster_state:ok" in s for s in states):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not reach cluster_state:ok within 20 s")

    @property
    def url(self) -> str:
        """A URL of one node (a cluster client discovers the others from it)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)
