"""The compiled fast paths of the breaker and retry success paths (docs/design.md, "Compiled fast
paths"). Everything else about the distribution is in pyproject.toml.

Both extensions are optional: a machine without a C compiler still installs stoic, which then
runs its pure-Python paths (the same rules; ``STOIC_PURE_PYTHON=1`` selects them on purpose).
"""

from setuptools import Extension, setup

_FLAGS = ["-Wall", "-Wextra"]
_SHARED = ["src/stoic/_ccompat.h"]  # the CPython stand-ins both include

setup(
    ext_modules=[
        Extension("stoic._cbreaker", ["src/stoic/_cbreaker.c"], depends=_SHARED, extra_compile_args=_FLAGS,
                  optional=True),
        Extension("stoic._cretry", ["src/stoic/_cretry.c"], depends=_SHARED, extra_compile_args=_FLAGS,
                  optional=True),
    ],
)
