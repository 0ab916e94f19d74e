"""Every integration page's runnable example runs (docs/httpx.md, aiohttp.md, asgi.md,
control-plane.md): the first ```python block of each, as a script, with a real server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^## A runnable example\n.*?^```python\n(.*?)^```", re.M | re.S)


@pytest.mark.integration
@pytest.mark.parametrize(("page", "says"), [
    ("httpx.md", ["200 ok", "503 down", "failures=3"]),
    ("aiohttp.md", ["200 ok", "failures=1"]),
    ("asgi.md", ["served", "shed with 503"]),
    ("control-plane.md", ["'forced_open': True", "refused: rate must be >= 1", "50 tenants:acme", "2 18\n10 10\n0 0"]),
])
def test_the_runnable_example_runs(page: str, says: list[str], tmp_path: Path) -> None:
    match = BLOCK.search((ROOT / "docs" / page).read_text(encoding="utf-8"))
    assert match is not None, f"docs/{page} has no runnable example"
    script = tmp_path / "example.py"
    script.write_text(match.group(1), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for text in says:
        assert text in done.stdout, (text, done.stdout)
