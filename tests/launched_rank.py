"""A stand-in rank for :mod:`snapeval.cli.launch`'s tests: what it does is read from ``LAUNCHED_<RANK>``
(``exit:<code>:<line>``, ``sleep``, ``sleep-then-interrupted``), and it prints its rank on stdout."""

from __future__ import annotations

import os
import signal
import sys
import time

rank = os.environ["RANK"]
print(f"rank {rank} of {os.environ['WORLD_SIZE']} at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
sys.stdout.flush()
action = os.environ.get(f"LAUNCHED_{rank}", "exit:0:")
if action.startswith("exit:"):
    _, code, line = action.split(":", 2)
    if line:
        print(line, file=sys.stderr)
    sys.exit(int(code))
if action == "sleep-then-interrupted":  # a rank that stops as interrupted on SIGTERM

    def stop(signum: int, frame: object) -> None:
        print("interrupted: stored samples kept", file=sys.stderr)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
time.sleep(120)
