"""How often the decisions are wrong, and how many samples they need: the tables of docs/decisions.md.

Through the project's own functions (:mod:`snapeval.stats.simulation`): the paired 0/1 scores of issue 43's
table (the full cache right with probability 0.9, the method keeping a right answer with probability r and
fixing no wrong one, 400 trials a cell) judged by :func:`snapeval.stats.retention`, beside the exact chance
of a pass summed over every outcome; the largest false-pass rate over full-cache accuracies 0.3-1.0 at
each n, for the rule, the report's ladder and the budget search; and the power (the n at which a method
that loses nothing passes four times in five).

    python benchmarks/decisions.py            # about a minute
    python benchmarks/decisions.py --smoke    # one cell of each table
"""

from __future__ import annotations

import argparse
import time
from datetime import date

from machine import available_cores, cpu_model
from tabulate import tabulate

from snapeval.commands.search import Settings, search
from snapeval.stats.simulation import exact_pass_probability, ladder_error_rate, pass_rate, search_error_rate

ISSUE_CELLS = ((0.90, 0.95), (0.93, 0.95), (0.97, 0.99))  # (true retention r, target)
ACCURACIES = (0.3, 0.6, 0.9, 1.0)


def issue_table(sizes: tuple[int, ...], trials: int) -> str:
    rows = []
    for n in sizes:
        row = {"n": n}
        for keep, target in ISSUE_CELLS:
            simulated = pass_rate(n, 0.9, keep, target, trials, seed=n)
            exact = exact_pass_probability(n, 0.9, keep, target)
            row[f"r={keep:g}, target {target:g}"] = f"{simulated:.1%} (exact {exact:.2%})"
        rows.append(row)
    return tabulate(rows, headers="keys", tablefmt="github")


def coverage_table(sizes: tuple[int, ...], trials: int) -> str:
    """Per n: the largest false-pass rate over full-cache accuracies, at the target and 0.05 below it
    (simulated, and exact for the rule)."""
    rows = []
    for n in sizes:
        row = {"n": n}
        for target in (0.95, 0.99):
            cells = [(accuracy, target - below) for accuracy in ACCURACIES for below in (0.0, 0.05)]
            simulated = max(pass_rate(n, a, keep, target, trials, seed=n) for a, keep in cells)
            exact = max(exact_pass_probability(n, a, keep, target) for a, keep in cells)
            row[f"rule, target {target:g}"] = f"{simulated:.1%} (exact {exact:.2%})"
        ladder = max(
            ladder_error_rate(n, accuracy, (0.95, 0.95, 0.95, 0.95, 1.0), 0.95, trials, seed=n)
            for accuracy in ACCURACIES
        )
        row["report's ladder (4 of 5 budgets at 0.95)"] = f"{ladder:.1%}"
        rows.append(row)
    return tabulate(rows, headers="keys", tablefmt="github")


def search_table(trials: int) -> str:
    rows = []
    settings = Settings("snapstream", 0.95, (128, 256, 512, 1024), 32, 10, 100)
    for threshold in (300, 700, 1024):
        for accuracy in (0.9, 1.0):
            rate, spent = search_error_rate(
                search,
                settings,
                lambda b, t=threshold: 1.0 if b >= t else 0.95,
                accuracy,
                trials,
                seed=threshold,
            )
            rows.append(
                {
                    "budgets below keep 0.95, from": threshold,
                    "full accuracy": accuracy,
                    "names a budget below the target": f"{rate:.1%}",
                    "samples spent (exhaustive: 3,000)": round(spent),
                }
            )
    return tabulate(rows, headers="keys", tablefmt="github")


def power_table(targets: tuple[float, ...]) -> str:
    rows = []
    for accuracy in ACCURACIES:
        row = {"full accuracy": accuracy}
        for target in targets:
            n = 1
            while exact_pass_probability(n, accuracy, 1.0, target) < 0.8:
                n = n * 2
            low, high = n // 2, n
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (
                    (middle, high)
                    if exact_pass_probability(middle, accuracy, 1.0, target) < 0.8
                    else (low, middle)
                )
            row[f"n for 80% at {target:g}"] = high
        rows.append(row)
    return tabulate(rows, headers="keys", tablefmt="github")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one cell of each table, few trials")
    args = parser.parse_args()
    sizes, trials = ((10,), 50) if args.smoke else ((5, 10, 30, 60, 100, 200, 300), 400)
    start = time.perf_counter()
    print(f"{date.today()}, {cpu_model()}, {available_cores()} cores; {trials} trials a cell\n")
    print(issue_table(sizes if args.smoke else (10, 30, 60, 100, 200), trials), end="\n\n")
    print(coverage_table(sizes, trials), end="\n\n")
    print(search_table(10 if args.smoke else 200), end="\n\n")
    print(power_table((0.95,) if args.smoke else (0.9, 0.95, 0.99)))
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
