"""Entry point of ``python -m snapeval.memory``."""

from snapeval.memory.cli import main

raise SystemExit(main())
