"""Start a real Redis (the Debian package's ``redis-server``) for stoic.fleet's integration tests.

It binds 127.0.0.1 on a free port, keeps nothing on disk (``--save "" --appendonly no``, its
working directory a temporary one) and is killed at the end, passed or failed. Without the
binary the tests skip with the reason, except under CI (CI=true), where they fail.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from prometheus_harness import free_port, require_binary, stop_process


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
