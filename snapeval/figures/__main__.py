"""``python -m snapeval.figures [--db URL] [--out DIR]``: every figure the database has data for."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from snapeval.errors import SnapevalError
from snapeval.figures import FIGURES, NothingToDraw
from snapeval.results import DB_ENV_VAR, DEFAULT_DB, load

DEFAULT_OUT = Path("results/figures")


def main(argv: list[str] | None = None) -> int:
    """Write each figure of :data:`FIGURES` into ``--out``, or say why it was skipped; 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m snapeval.figures", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db", help=f"database path or SQLAlchemy URL (default: ${DB_ENV_VAR}, else {DEFAULT_DB})"
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})"
    )
    args = parser.parse_args(argv)
    try:
        if args.out.exists() and not args.out.is_dir():
            raise SnapevalError(f"{args.out} is a file; give a folder for the figures", "--out")
        df = load(args.db, field="--db")
        for name, draw in FIGURES.items():
            try:
                paths = draw(df, args.out)
            except NothingToDraw as exc:
                print(f"skipped {name}: {exc}")
                continue
            except OSError as exc:
                raise SnapevalError(f"cannot write to {args.out}: {exc.strerror or exc}", "--out") from None
            print(f"wrote {name}: {', '.join(map(str, paths))}")
    except SnapevalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
