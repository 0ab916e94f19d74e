"""Why retries are jittered: two hundred clients that failed together, retrying in lockstep.

Run: ``python -m examples.jitter_figure`` (draws ``docs/figures/jitter.png``; matplotlib is an
optional dependency of the examples, in requirements-dev.txt). Deterministic: the jitter comes
from a generator seeded per strategy, so the figure and the numbers are the same on every run.

Each client retries three times after exponential delays of 200, 400 and 800 ms, so without
jitter all of them arrive at 200, 600 and 1,400 ms on the dot and the recovering dependency
meets its whole caller base three times. Jitter ``j`` draws each delay uniformly from
[base x (1 - j), base]: half jitter (0.5) and full jitter (1.0) spread the arrivals. The number
that matters to the dependency is the busiest 25 ms: how many retries land in the worst window.

The script refuses to write the figure when the peaks stop falling (none > half > full): the
figure exists to show that, and would otherwise be quietly wrong.
"""

from __future__ import annotations

import itertools
import random
import sys
from dataclasses import dataclass
from pathlib import Path

CLIENTS = 200
BASE_DELAYS_MS = (200, 400, 800)
WINDOW_US = 25_000  # the busiest-window width: 25 ms
SEED = 2026
STRATEGIES = (("no jitter", 0.0), ("half jitter", 0.5), ("full jitter", 1.0))
FIGURE = Path(__file__).resolve().parent.parent / "docs" / "figures" / "jitter.png"


@dataclass(frozen=True)
class Strategy:
    name: str
    jitter: float
    arrivals_us: tuple[int, ...]  # every retry's arrival instant, microseconds after the failure
    peak: int  # retries in the busiest 25 ms window


def arrivals(jitter: float, *, clients: int = CLIENTS, seed: int = SEED) -> list[int]:
    """Retry arrival instants (µs) of ``clients`` clients that all failed at 0."""
    rng = random.Random(f"{seed}:{jitter}")
    out: list[int] = []
    for _ in range(clients):
        at = 0
        for base_ms in BASE_DELAYS_MS:
            # Uniform in [base x (1 - jitter), base]: jitter only ever shortens a delay.
            at += round(base_ms * 1000 * (1.0 - jitter * rng.random()))
            out.append(at)
    return sorted(out)


def busiest_window(instants_us: list[int], width_us: int = WINDOW_US) -> int:
    """The most instants in any half-open window [t, t + width) (sliding, exact)."""
    best = 0
    left = 0
    for right, at in enumerate(instants_us):
        while at - instants_us[left] >= width_us:
            left += 1
        best = max(best, right - left + 1)
    return best


def strategies() -> list[Strategy]:
    """The three strategies with their arrivals and busiest-window peaks."""
    out = []
    for name, jitter in STRATEGIES:
        times = arrivals(jitter)
        out.append(Strategy(name, jitter, tuple(times), busiest_window(times)))
    return out


def peaks_fall(result: list[Strategy]) -> bool:
    """Whether every strategy's busiest window is strictly below the previous one's."""
    return all(a.peak > b.peak for a, b in itertools.pairwise(result))


def draw(result: list[Strategy], path: Path) -> None:
    """Draw arrivals per 25 ms bin, one panel per strategy, into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizon_ms = sum(BASE_DELAYS_MS) + 100
    bins = [i * WINDOW_US / 1000 for i in range(int(horizon_ms * 1000 // WINDOW_US) + 1)]
    fig, axes = plt.subplots(len(result), 1, figsize=(8, 6), sharex=True, sharey=True)
    for ax, strategy in zip(axes, result, strict=True):
        ax.hist([t / 1000 for t in strategy.arrivals_us], bins=bins, color="#3b6ea8")
        ax.set_title(f"{strategy.name}: busiest 25 ms window = {strategy.peak} retries", fontsize=10, loc="left")
        ax.set_ylabel("retries / 25 ms")
    axes[-1].set_xlabel("ms after 200 clients failed together (retries after 200, 400, 800 ms)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    path = Path(argv[0]) if argv else FIGURE
    result = strategies()
    for s in result:
        print(f"{s.name:<12} busiest 25 ms window: {s.peak:>3} of {len(s.arrivals_us)} retries")
    if not peaks_fall(result):
        print("refusing to draw: the peaks do not fall from no jitter to half to full", file=sys.stderr)
        return 1
    draw(result, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
