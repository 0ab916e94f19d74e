"""The demo's flaky dependency: a real HTTP server in its own process, following a script.

Run as ``python -m examples.demo.dependency --phases healthy=6,failing=9,slow=9,recovered``. It
binds a free port on 127.0.0.1 (or ``--port``), prints one line ``LISTENING <port>`` on stdout
and then serves ``GET /work`` according to the phase in force at the time since it started:

- ``healthy``: 200 after a short, slightly random delay (``--latency``, seconds);
- ``failing``: 503 at once (the dependency is down and says so);
- ``slow``: 200, but only after ``--slow-latency`` seconds (longer than the client's
  ``slow_call_duration``: it answers, just not in time to be useful);
- ``recovered``: like healthy.

``GET /search`` is the read endpoint the demo hedges: whatever the phase, it answers 200 after
about ``--latency``, except one request in ``--tail-every`` (default 6), which takes twelve times
longer (a tail a hedged read beats).

A phase without ``=seconds`` lasts forever (only the last one may); with ``--repeat`` every phase
has a length and the script starts over after the last one. ``GET /phase`` returns the
phase in force. The process exits cleanly on SIGTERM or SIGINT, and with ``--exit-on-stdin-eof``
when its stdin closes (so it never outlives a parent that died without stopping it).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

PHASES = ("healthy", "failing", "slow", "recovered")


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float | None  # None: until the process ends


def parse_phases(text: str) -> list[Phase]:
    """``"healthy=6,failing=9,slow=9,recovered"`` -> phases; ValueError on anything else."""
    phases: list[Phase] = []
    for item in text.split(","):
        name, _, seconds = item.strip().partition("=")
        if name not in PHASES:
            raise ValueError(f"phase {name!r}: expected one of {', '.join(PHASES)}")
        if phases and phases[-1].seconds is None:
            raise ValueError("only the last phase may last forever (give the others =seconds)")
        length = float(seconds) if seconds else None
        if length is not None and not length > 0:
            raise ValueError(f"phase {name!r}: seconds must be > 0, got {seconds}")
        phases.append(Phase(name, length))
    return phases


def format_phases(phases: list[Phase]) -> str:
    return ",".join(p.name if p.seconds is None else f"{p.name}={p.seconds:g}" for p in phases)


class Script:
    """Which phase is in force, by monotonic time since the script started."""

    def __init__(self, phases: list[Phase], latency: float, slow_latency: float, repeat: bool = False,
                 tail_every: int = 6) -> None:
        self.phases = phases
        self.tail_every = tail_every
        self.repeat = repeat
        self.latency = latency
        self.slow_latency = slow_latency
        self.started = time.monotonic()

    def phase(self) -> str:
        elapsed = time.monotonic() - self.started
        if self.repeat:  # every phase has a length (main checks): start over after the last one
            elapsed %= sum(p.seconds or 0.0 for p in self.phases)
        for phase in self.phases:
            if phase.seconds is None or elapsed < phase.seconds:
                return phase.name
            elapsed -= phase.seconds
        return self.phases[-1].name  # the script ran out: stay in the last phase

    def respond(self) -> tuple[int, float]:
        """(status, seconds to wait before answering) for a request arriving now."""
        phase = self.phase()
        if phase == "failing":
            return 503, 0.0
        if phase == "slow":
            return 200, self.slow_latency * random.uniform(1.0, 1.2)
        return 200, self.latency * random.uniform(0.5, 1.5)

    def search(self) -> float:
        """Seconds to wait before answering a search: usually short, one in ``tail_every`` twelve times longer."""
        slow = random.randrange(self.tail_every) == 0
        return self.latency * (12.0 if slow else 1.0) * random.uniform(0.8, 1.2)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: the client reuses connections
    # Headers and body go out in separate writes; with Nagle's algorithm on, the body waits for
    # the client's delayed ACK (~40 ms) and every "fast" answer would take that long.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        script = self.server.script
        if self.path == "/phase":
            self._reply(200, {"phase": script.phase()})
        elif self.path.split("?", 1)[0] == "/work":
            status, delay = script.respond()
            if delay:
                time.sleep(delay)  # a thread per connection: sleeping here slows only this request
            self._reply(status, {"phase": script.phase(), "ok": status == 200})
        elif self.path.split("?", 1)[0] == "/search":
            time.sleep(script.search())
            self._reply(200, {"hits": 3})
        else:
            self._reply(404, {"error": "not found"})

    def _reply(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 503:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would drown the demo's own output


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], script: Script) -> None:
        super().__init__(address, _Handler)
        self.script = script

    def handle_error(self, request: object, client_address: object) -> None:
        # A hedged read that lost is cancelled: its client hangs up mid-answer. Expected, not an error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.demo.dependency", description=__doc__.splitlines()[0])
    parser.add_argument("--phases", default="healthy=6,failing=9,slow=9,recovered",
                        help="comma-separated name[=seconds] (default: %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--latency", type=float, default=0.01, help="typical healthy latency, seconds")
    parser.add_argument("--slow-latency", type=float, default=0.5, help="latency in the slow phase, seconds")
    parser.add_argument("--repeat", action="store_true",
                        help="start the script over after its last phase (every phase needs =seconds)")
    parser.add_argument("--exit-on-stdin-eof", action="store_true",
                        help="stop when stdin closes (the demo holds it open: we never outlive it)")
    args = parser.parse_args(argv)
    try:
        phases = parse_phases(args.phases)
    except ValueError as exc:
        parser.error(str(exc))
    if args.repeat and phases[-1].seconds is None:
        parser.error("--repeat needs a length for every phase, the last one included")

    server = _Server(("127.0.0.1", args.port), Script(phases, args.latency, args.slow_latency, args.repeat))
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    def _watch_stdin() -> None:
        # The parent holds our stdin open; EOF means it is gone (or asked us to stop).
        try:
            while sys.stdin.buffer.read(1024):
                pass
        except (OSError, ValueError):
            pass
        stop.set()

    if args.exit_on_stdin_eof:
        threading.Thread(target=_watch_stdin, name="stdin-watch", daemon=True).start()
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True)
    serving.start()
    print(f"LISTENING {server.server_address[1]}", flush=True)
    try:
        while not stop.wait(0.2):
            pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
