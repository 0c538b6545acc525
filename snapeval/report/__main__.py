"""``python -m snapeval.report [--db URL] [--out PATH] [--markdown] [--targets T ...]
[--max-output-growth G] [--gates SPEC]``."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from snapeval.cli import one_line_errors
from snapeval.cli.world import writing_rank
from snapeval.errors import SnapevalError
from snapeval.results.files import safe_output, write_atomically
from snapeval.results.options import add_db_option, open_existing

DEFAULT_TARGETS = (0.95, 0.99)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snapeval.report",
        description="One self-contained HTML (or Markdown) decision report of a results database.",
    )
    add_db_option(parser)
    parser.add_argument("--out", type=Path, help="the file to write (default: report.html, or report.md)")
    parser.add_argument("--markdown", action="store_true", help="write Markdown instead of HTML")
    parser.add_argument(
        "--targets",
        type=float,
        nargs="+",
        default=list(DEFAULT_TARGETS),
        help="retention targets (default: 0.95 0.99)",
    )
    parser.add_argument(
        "--max-output-growth",
        metavar="G",
        help="also require the method's mean output length over the full cache's to be shown at most G "
        "(e.g. 1.1; default: not required)",
    )
    parser.add_argument(
        "--gates", type=Path, help="a gate spec (conf/gates/ci.yaml) to judge on the stored samples"
    )
    parser.add_argument("--flips", type=int, default=5, help="flipped samples shown per setting (default: 5)")
    args = parser.parse_args(argv)
    if not writing_rank():  # under torchrun rank 0 alone writes the report
        return 0
    if any(not math.isfinite(t) or t <= 0 for t in args.targets):
        raise SnapevalError(
            f"must be finite numbers > 0, got {' '.join(map(str, args.targets))}", "--targets"
        )
    max_growth = _max_growth(args.max_output_growth)
    if args.flips < 0:
        raise SnapevalError(f"must be >= 0, got {args.flips}", "--flips")
    out = args.out or Path("report.md" if args.markdown else "report.html")
    from snapeval.results import database_url, sqlite_path  # SQLAlchemy: where --db is, if a file

    target = safe_output(out, {"--db": sqlite_path(database_url(args.db)), "--gates": args.gates}, "--out")
    if not target.parent.is_dir():
        raise SnapevalError(f"cannot write the report: no folder {target.parent}", "--out")
    from snapeval.report import build_report, render_html, render_markdown  # numpy, pandas, SQLAlchemy

    gates = []
    if args.gates:
        from snapeval.commands.gate import load_gates  # Hydra: only to judge gates

        gates = load_gates(args.gates)
    with open_existing(args.db) as db:
        document = build_report(
            db,
            sorted(set(args.targets)),
            figures=not args.markdown,
            flips=args.flips,
            gates=gates,
            max_output_growth=max_growth,
        )
    text = render_markdown(document) if args.markdown else render_html(document)
    try:
        with write_atomically(target) as file:
            file.write(text)
    except OSError as exc:
        raise SnapevalError(f"cannot write the report: {exc.strerror}", "--out") from None
    print(f"wrote {out} ({len(text.encode()) / 1024:,.0f} KiB)")
    return 0


def _max_growth(text: str | None) -> float | None:
    """``--max-output-growth`` as a number > 0 (None where not given)."""
    if text is None:
        return None
    try:
        bound = float(text)
    except ValueError:
        bound = math.nan
    if not math.isfinite(bound) or bound <= 0:
        raise SnapevalError(f"must be a finite number > 0 (e.g. 1.1), got {text}", "--max-output-growth")
    return bound


if __name__ == "__main__":
    sys.exit(main())
