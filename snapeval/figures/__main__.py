"""``python -m snapeval.figures``: :func:`snapeval.figures.command.main`."""

import sys

from snapeval.figures.command import main

sys.exit(main())
