"""``python -m examples.demo``: see :mod:`examples.demo.app`."""

from .app import main

raise SystemExit(main())
