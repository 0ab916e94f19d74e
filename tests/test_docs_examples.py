"""Every ```python block of README.md and docs/*.md runs (issue 11: no example can go stale).

The blocks of one page run in order, in one namespace, in a fresh process (top-level ``await``
allowed). A block that cannot run standalone (a server, a network, a secret) is preceded by
``<!-- not run: <reason> -->``; the reason must say something.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _docs_runner import blocks

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", [p for p in PAGES if any(True for _ in blocks(p.read_text(encoding="utf-8")))],
                         ids=lambda p: p.name)
def test_every_python_block_of_the_page_runs(page: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "_docs_runner.py"), str(page)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for _, _, reason in blocks(page.read_text(encoding="utf-8")):
        assert reason is None or len(reason) > 3, f"{page.name}: a not-run marker must give its reason"


@pytest.mark.parametrize("page", [p for p in PAGES if any(r for _, _, r in blocks(p.read_text(encoding="utf-8")))],
                         ids=lambda p: p.name)
def test_no_block_marked_not_run_runs_standalone(page: Path) -> None:
    # A marker on a block that would run hides a working example from the test above (hedge.md,
    # retry.md and bulkhead.md kept markers naming objects their blocks no longer used).
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "_docs_runner.py"), "--markers", str(page)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_runner_reports_a_stale_marker(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- not run: needs a server -->\n```python\nx = 1\n```\n\n"
                    "<!-- not run: needs a server -->\n```python\nserver.wait()\n```\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "_docs_runner.py"), "--markers", str(page)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "page.md:2:" in done.stderr and "page.md:7:" not in done.stderr, done.stderr


def test_the_runner_finds_blocks_and_their_opt_outs() -> None:
    text = "x\n\n```python\nprint(1)\n```\n\n<!-- not run: needs a server -->\n```python\nboom()\n```\n"
    assert blocks(text) == [(3, "print(1)\n", None), (8, "boom()\n", "needs a server")]


def test_every_test_a_page_names_exists() -> None:
    # The docs point readers at the tests that hold a rule (docs/field-reports.md above all): a
    # renamed or removed test must not leave a page citing it.
    import re

    defined = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py"))
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for name in set(re.findall(r"\b(test_[a-z0-9_]+)\b", text)):
            if f"def {name}" in text:  # an example test written out on the page itself
                continue
            assert f"def {name}" in defined or any((ROOT / "tests").rglob(f"{name}.py")), f"{page.name}: {name}"


def test_the_field_reports_table_has_a_row_per_report_it_counts() -> None:
    import re

    text = (ROOT / "docs" / "field-reports.md").read_text(encoding="utf-8")
    rows = [int(n) for n in re.findall(r"^\| (\d+) \|", text, re.M)]
    (counted,) = re.findall(r"have reported (\d+) failures", text)
    assert rows == list(range(1, int(counted) + 1)), rows
