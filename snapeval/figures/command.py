"""``python -m snapeval.figures [--db URL] [--out DIR]``: every figure the database has data for."""

from __future__ import annotations

import argparse
from pathlib import Path

from snapeval.cli import one_line_errors
from snapeval.cli.world import writing_rank
from snapeval.errors import SnapevalError
from snapeval.figures import FIGURES, NothingToDraw
from snapeval.figures.panels import figure_paths
from snapeval.results import database_url, load, sqlite_path
from snapeval.results.files import safe_output
from snapeval.results.options import DB_OPTION, add_db_option

DEFAULT_OUT = Path("results/figures")


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    """Write each figure of :data:`FIGURES` into ``--out``, or say why it was skipped; 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m snapeval.figures",
        description="Paper figures (PDF and PNG) from the results database.",
    )
    add_db_option(parser)
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})"
    )
    args = parser.parse_args(argv)
    if not writing_rank():  # under torchrun rank 0 alone writes the figures
        return 0
    if args.out.exists() and not args.out.is_dir():
        raise SnapevalError(f"{args.out} is a file; give a folder for the figures", "--out")
    inputs = {DB_OPTION: sqlite_path(database_url(args.db))}
    for name in FIGURES:
        for path in figure_paths(args.out, name):
            safe_output(path, inputs, "--out")
    df = load(args.db, field=DB_OPTION)
    for name, draw in FIGURES.items():
        try:
            paths = draw(df, args.out)
        except NothingToDraw as exc:
            print(f"skipped {name}: {exc}")
            continue
        except OSError as exc:
            raise SnapevalError(f"cannot write to {args.out}: {exc.strerror or exc}", "--out") from None
        print(f"wrote {name}: {', '.join(map(str, paths))}")
    return 0
