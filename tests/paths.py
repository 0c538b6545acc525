"""Where tests find the project's shared benchmark data (never copied into the repository)."""

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(
    os.environ.get("SNAPEVAL_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data"
)

#: For tests that read the real benchmark data: skipped, with the reason, in a clone without it.
needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"no shared benchmark data at {SHARED_DATA} (set SNAPEVAL_DATA_DIR)"
)
