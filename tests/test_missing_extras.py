"""An integration imported without its optional extra says which extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("stoic.httpx", "httpx", "stoic[httpx]"),
    ("stoic.aiohttp", "aiohttp", "stoic[aiohttp]"),
])
def test_an_integration_without_its_extra_names_the_extra(module: str, blocked: str, extra: str) -> None:
    # sys.modules[name] = None makes every import of it fail, as if it were not installed.
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)\nelse:\n    print('imported')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert extra in done.stdout, done.stdout + done.stderr


def test_the_core_imports_no_optional_dependency() -> None:
    code = ("import sys, stoic\n"
            "print(sorted(m for m in ('httpx', 'aiohttp', 'redis', 'uvicorn', 'opentelemetry', 'structlog',"
            " 'prometheus_client') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
