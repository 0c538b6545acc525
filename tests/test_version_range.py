"""The supported versions are stated once, in ``snapeval.couplings.TESTED``: docs/models.md's table of
supported versions says the same ranges, row by row (pyproject.toml's pins are checked against TESTED in
tests/test_couplings.py), and so does the page's example of the one-line error."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.utils import canonicalize_name

from snapeval.couplings import MLA_LATENT_CACHE, TESTED

MODELS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "models.md"


def supported_rows() -> dict[str, str]:
    """The table of docs/models.md's "Supported transformers" section: distribution -> its range cell."""
    section = MODELS_PAGE.read_text().split("## Supported transformers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|$", section, re.M)
    return {canonicalize_name(package.split()[0]): cell for package, cell in rows[1:]}  # the header left out


def stated(low: str, high: str) -> str:
    return low if low == high else f"{low} - {high}"


def test_the_docs_table_of_supported_versions_is_tested():
    rows = supported_rows()
    assert set(rows) == {canonicalize_name(package) for package in TESTED}, "one row per package of TESTED"
    for package, (low, high) in TESTED.items():
        cell = rows[canonicalize_name(package)]
        assert re.match(rf"{re.escape(stated(low, high))}( \(|$)", cell), (
            f"docs/models.md states {cell!r} for {package}; snapeval.couplings.TESTED: {stated(low, high)}"
        )
    assert f"MLA/DeepSeek from {MLA_LATENT_CACHE}," in rows["transformers"]


def test_the_docs_example_error_states_the_tested_range():
    low, high = TESTED["transformers"]
    examples = re.findall(r"supported: (\S+?)-(\S+?)`", " ".join(MODELS_PAGE.read_text().split()))
    assert examples and all(example == (low, high) for example in examples), examples
