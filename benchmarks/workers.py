"""Workers benchmark: wall time of one sweep with 1 local worker and with N, through Hydra's joblib launcher.

Each worker count runs the same sweep into a fresh SQLite database, as a Hydra multirun whose jobs are
the shards of the sweep (``run.shard=0/N,...``, ``hydra/launcher=joblib hydra.launcher.n_jobs=N``;
joblib gives each worker process ``cores / N`` threads), then, for N workers, once more as N copies of
the same command splitting the samples by claims only (no shards; each given ``cores / N`` threads
through ``OMP_NUM_THREADS``, as joblib does). It prints the machine, the date and
a row per run: workers, how the work was split, wall seconds, samples stored, speed-up over 1 worker.

    python benchmarks/workers.py                               # ruler_budget_sweep, 4 prompts, 1 vs 2
    python benchmarks/workers.py --workers 2 4 --limit 8
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from arguments import at_least
from tabulate import tabulate

from snapeval.cli import one_line_errors
from snapeval.results import ResultsDB


def sweep(workers: int, experiment: str, limit: int, db: str, claims_only: bool) -> list[list[str]]:
    """The command line(s) of one timed run: a joblib multirun over shards, or N copies of one command."""
    point = [f"+exp={experiment}", f"run.limit={limit}", "run.progress=false", f'run.db="{db}"']
    if workers == 1 or claims_only:
        return [[sys.executable, "-m", "snapeval", *point]] * workers
    shards = ",".join(f"{index}/{workers}" for index in range(workers))
    launcher = ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={workers}"]
    return [[sys.executable, "-m", "snapeval", "-m", *point, f"run.shard={shards}", *launcher]]


def timed(commands: list[list[str]], folder: Path) -> float:
    """Wall seconds until every command (started together, each with ``cores / commands`` threads, as
    joblib gives its workers) has ended; each must succeed."""
    threads = str(max(1, (os.cpu_count() or 1) // len(commands)))
    env = {**os.environ, "OMP_NUM_THREADS": threads} if len(commands) > 1 else None
    start = time.perf_counter()
    processes = [
        subprocess.Popen(
            command, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for command in commands
    ]
    for process in processes:
        _, err = process.communicate()
        if process.returncode:
            sys.exit(f"error: a worker failed: {err.strip().splitlines()[-1:]}")
    return time.perf_counter() - start


@one_line_errors
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default="ruler_budget_sweep", help="the +exp= to run")
    parser.add_argument("--limit", type=int, default=4, help="run.limit: prompts per point")
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="worker counts to compare with 1")
    args = parser.parse_args()
    at_least(args, {"--limit": 1, "--workers": 1})
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"# {datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, {os.cpu_count()} cores, load {load}")
    print(f"# python -m snapeval +exp={args.experiment} run.limit={args.limit}")
    rows, single = [], None
    runs = [(1, False)] + [(n, claims) for n in args.workers for claims in (False, True)]
    for workers, claims_only in runs:
        with tempfile.TemporaryDirectory() as folder:
            db = str(Path(folder) / "workers.sqlite")  # fresh: every run computes everything
            seconds = timed(sweep(workers, args.experiment, args.limit, db, claims_only), Path(folder))
            with ResultsDB(db) as opened:
                stored = len(opened.dataframe())
        single = single or seconds
        split = (
            "1 job" if workers == 1 else ("same command x N (claims)" if claims_only else "shards (joblib)")
        )
        rows.append([workers, split, f"{seconds:.1f}", stored, f"{single / seconds:.2f}x"])
    print(tabulate(rows, headers=["workers", "split", "wall s", "samples", "speed-up"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
