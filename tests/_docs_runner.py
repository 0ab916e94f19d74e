"""Run the ```python blocks of one Markdown page, in order, in one namespace (tests/test_docs_examples.py).

Usage: ``python tests/_docs_runner.py PAGE.md``. A block preceded by a line
``<!-- not run: <reason> -->`` is skipped. Top-level ``await`` is allowed: such a block runs on
the page's one event loop. Prints ``ran N skipped M`` and exits 0, or prints the failing block's
line and the traceback and exits 1. Each page runs in a fresh process, so what one page installs
(sinks, providers, structlog configuration) cannot leak into another.

With ``--markers`` it also tries every skipped block (in a copy of the page's namespace, an
awaited one for at most a few seconds) and exits 1 naming those that ran without an error: a
marker on a block that runs standalone is stale, and hides a runnable example from the check.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import sys
import traceback
from pathlib import Path

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*$")


def blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line number, code, the not-run reason or None) of every ```python block."""
    out = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = _NOT_RUN.search(before)
        out.append((line, match.group(1), reason.group(1) if reason else None))
    return out


def _runs_standalone(page: Path, line: int, code: str, namespace: dict[str, object],
                     loop: asyncio.AbstractEventLoop) -> bool:
    try:
        compiled = compile(code, f"{page.name}:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(compiled, dict(namespace))  # the docs' own examples
        if inspect.iscoroutine(result):
            loop.run_until_complete(asyncio.wait_for(result, 3))
    except BaseException:
        return False
    return True


def main(path: str, markers: bool = False) -> int:
    page = Path(path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    loop = asyncio.new_event_loop()
    ran = skipped = 0
    stale = []
    try:
        for line, code, reason in blocks(page.read_text(encoding="utf-8")):
            if reason is not None:
                skipped += 1
                if markers and _runs_standalone(page, line, code, namespace, loop):
                    stale.append(line)
                continue
            try:
                compiled = compile(code, f"{page.name}:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                result = eval(compiled, namespace)  # the docs' own examples
                if inspect.iscoroutine(result):
                    loop.run_until_complete(result)
            except BaseException:
                print(f"{page}:{line}: the block starting here failed", file=sys.stderr)
                traceback.print_exc()
                return 1
            ran += 1
    finally:
        loop.close()
    print(f"ran {ran} skipped {skipped}")
    for line in stale:
        print(f"{page}:{line}: this block is marked not run but runs standalone: drop the marker", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1], markers="--markers" in sys.argv[1:-1]))
