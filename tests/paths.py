"""Where tests find the project's shared benchmark data (never copied into the repository)."""

import os
from pathlib import Path

SHARED_DATA = Path(
    os.environ.get("SNAPEVAL_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data"
)
