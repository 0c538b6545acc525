"""The decision report (``python -m snapeval.report``) of a hand-made database whose scores are known: its
numbers against the stats computed here, its HTML self-contained, its Markdown, its errors, no torch."""

from __future__ import annotations

import base64
import importlib.metadata
import re
import shutil
import sqlite3
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import yaml

from snapeval.commands.gate import Gate, load_gates
from snapeval.configs.compose import compose_config
from snapeval.memory import estimate
from snapeval.paths import CONF_DIR
from snapeval.report import build_report
from snapeval.report.__main__ import main
from snapeval.report.document import (
    Bullets,
    Heading,
    Histogram,
    Mark,
    Paragraph,
    Table,
    binary_size,
    interval,
)
from snapeval.report.experiment import TOO_SMALL, TOO_SMALL_NOTE
from snapeval.results import ResultsDB, database_url, identity
from snapeval.stats import mean_ci, retention

PASSKEY = ["model=llama-3.1-8b-instruct", "task=ruler_passkey", "task.context_length=1024"]
N = 100
FULL = [1.0] * 98 + [0.0] * 2  # wrong on passkey-98 and passkey-99
#: SnapStream 256 loses passkey-5 and gains passkey-98: retention 1, keeps 97 of the 98 the full cache gets
#: right (lower bound 0.953: p**98 + 98 p**97 (1 - p) = 0.05), shows 0.95; 0.99 needs 299 kept of 299.
SNAPSTREAM = {
    128: [1.0] * 80 + [0.0] * 20,
    256: [1.0 if i != 5 else 0.0 for i in range(98)] + [1.0, 0.0],
    512: FULL,
}
SNAPKV = {128: [1.0] * 60 + [0.0] * 40, 256: [1.0] * 90 + [0.0] * 10}
KV_BYTES = {"full": 400_000, 128: 50_000, 256: 100_000, 512: 200_000}
KEPT = {"bins": [i / 10 for i in range(11)], "counts": [1.0, 0.1, 0.0, 0.2, 0.0, 0.3, 0.0, 0.1, 0.5, 1.0]}
TRACE = {"generated_tokens": 900, "truncated": False, "reasoning_closed": True, "eviction_count": 2}
AIME = ["model.pretrained=acme/tiny-base", "+protocol=aime24_r1", "generation.num_samples=2"]  # uncatalogued
SMOKE_GATE = {
    "name": "passkey-smoke",
    "task": ["task=ruler_passkey", "task.context_length=512", "run.limit=20"],
    "cache": ["cache=snapstream", "cache.budget=256"],
    "min_retained": 0.8,
    "min_n": 20,
}


def store(
    db: ResultsDB, overrides: list[str], scores: list[float], kv_bytes: int | None = None, **extra
) -> None:
    """Store ``scores`` as samples ``<task>-0``, ``-1``, ... of the config of ``overrides`` (Hydra's), under
    the config and hash the runner stores."""
    config, digest = identity(compose_config(*overrides))
    run_id = db.start_run(config, digest)
    for index, score in enumerate(scores):
        row = {
            "sample_id": f"{config['task']['name'].split('_')[-1]}-{index}",
            "score": score,
            "output": f"The answer is {index if score else 'unknown'}",
            "target": str(index),
            "prompt_tokens": 1000,
            "kv_bytes": kv_bytes,
            "generated_tokens": 10,
            "decode_s": 0.5,
            "extra": extra,
        }
        db.add_sample(run_id, digest, row)
    db.finish_run(run_id)


@pytest.fixture(scope="module")
def db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Llama passkey (full, SnapStream and SnapKV over budgets), the same at 2048 tokens without a full
    cache, a Gemma AIME run with traces (a model outside the estimator's catalogue), the CI gate's pair."""
    url = database_url(tmp_path_factory.mktemp("report") / "results.sqlite")
    with ResultsDB(url) as db:
        store(db, [*PASSKEY, "cache=full"], FULL, KV_BYTES["full"])
        for budget, scores in SNAPSTREAM.items():
            cache = ["cache=snapstream", f"cache.budget={budget}"]
            store(db, [*PASSKEY, *cache], scores, KV_BYTES[budget], kept_histogram=KEPT)
        for budget, scores in SNAPKV.items():
            store(db, [*PASSKEY, "cache=snapkv", f"cache.budget={budget}"], scores, KV_BYTES[budget])
        store(db, [*PASSKEY[:2], "task.context_length=2048", "cache=snapkv", "cache.budget=256"], [1.0, 0.0])
        aime_extra = {"trace": TRACE, "deviations": ["qwen_math_latex_parser"]}
        store(db, [*AIME, "cache=full"], [1.0, 0.0, 1.0], **aime_extra)
        store(db, [*AIME, "cache=snapstream", "cache.budget=256"], [1.0, 0.0, 0.0], **aime_extra)
        full, compressed = Gate.from_spec(SMOKE_GATE, "test").overrides()
        store(db, list(full), [1.0] * 20)
        store(db, list(compressed), [1.0] * 19 + [0.0])
    return url


@pytest.fixture(scope="module")
def document(db_url):
    with ResultsDB(db_url) as db:
        return build_report(db, (0.95, 0.99), figures=False)


@pytest.fixture(scope="module")
def html(db_url, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["--db", db_url, "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def section(document, heading: str) -> list:
    """The blocks under the first heading that starts with ``heading``, up to the next heading of its
    level or above."""
    blocks = list(document.blocks)
    start = next(i for i, b in enumerate(blocks) if isinstance(b, Heading) and b.text.startswith(heading))
    level = blocks[start].level
    ends = (
        i
        for i in range(start + 1, len(blocks))
        if isinstance(blocks[i], Heading) and blocks[i].level <= level
    )
    return blocks[start : next(ends, len(blocks))]


def tables(document, heading: str) -> list[Table]:
    return [block for block in section(document, heading) if isinstance(block, Table)]


def row_of(table: Table, first: str) -> tuple:
    return next(row for row in table.rows if row[0] == first)


def text(cell) -> str:
    return cell.text if isinstance(cell, Mark) else str(cell)


LLAMA_1024 = "llama-3.1-8b-instruct · ruler_passkey (task.context_length=1024)"


def test_retention_and_its_bounds_are_the_paired_ones(document):
    accuracy = tables(document, LLAMA_1024)[0]
    assert accuracy.header[5:8] == ("Retention [95% bounds]", "Keeps 0.95", "Keeps 0.99")
    row = row_of(accuracy, "SnapStream 256")
    method = SNAPSTREAM[256]
    bounds = retention(method, FULL)
    assert (bounds.ratio, bounds.lower, bounds.evidence) == (1.0, pytest.approx(0.9525, abs=1e-4), 98)
    # upper: 98 of 100 right, 0.9976 at 97.5%, over the full cache's lower bound 0.9296: 1.073
    expected = (str(N), interval(*mean_ci(method)), str(N), "0.980", "1.000 [0.953, 1.073]")
    assert row[1:6] == expected
    assert row[6:8] == (Mark("yes", "pass"), Mark("too few (needs 299)", "muted"))  # 0.99**299 = 0.0495
    # SnapKV 256 keeps 90 of 98: [0.858, 1.023] holds 0.95 (open); SnapKV 128 keeps 60: [0.524, 0.749]
    assert row_of(accuracy, "SnapKV 256")[6] == Mark("open", "muted")
    assert row_of(accuracy, "SnapKV 128")[6] == Mark("no", "fail")
    assert row_of(accuracy, "Full cache")[5] == "reference"


def decision_row(document, method: str, settings: str) -> tuple:
    [decisions] = tables(document, "Decision")
    return next(r for r in decisions.rows if r[3] == method and r[2] == settings)


TOO_FEW_099 = "n too small: 98 of 299"  # SnapStream 512 keeps the 98 the full cache gets right


def test_the_smallest_budget_shown_to_keep_each_target_or_why_none(document):
    snapstream = decision_row(document, "SnapStream", "task.context_length=1024")
    assert [text(cell) for cell in snapstream[5:]] == ["256 (retention 1.000)", TOO_FEW_099]
    assert [cell.tone for cell in snapstream[5:]] == ["pass", "muted"]
    snapkv = decision_row(document, "SnapKV", "task.context_length=1024")
    assert snapkv[5] == Mark("none of the measured budgets (largest 256: 0.918)", "fail")  # open at 0.95
    assert text(snapkv[6]) == TOO_FEW_099
    unpaired = decision_row(document, "SnapKV", "task.context_length=2048")
    assert unpaired[4] == "not stored" and "no full-cache run" in text(unpaired[5])


def test_other_targets_move_the_decision(db_url):
    """SnapStream 128 keeps 80 of 98: lower bound 0.740, so 0.7 is shown and 0.8 is not (open)."""
    with ResultsDB(db_url) as db:
        document = build_report(db, (0.7, 0.8), figures=False)
    [decisions] = tables(document, "Decision")
    assert decisions.header[-2:] == ("Retention 0.7", "Retention 0.8")
    row = decision_row(document, "SnapStream", "task.context_length=1024")
    assert [text(cell).split(" (")[0] for cell in row[5:]] == ["128", "256"]
    row = decision_row(document, "SnapKV", "task.context_length=1024")  # 256: lower bound 0.858
    assert [text(cell).split(" (")[0] for cell in row[5:]] == ["256", "256"]


def test_the_decision_descends_from_the_largest_budget_and_says_when_n_is_too_small(tmp_path):
    """SnapStream 128 keeps all 100 samples (lower bound 0.05**(1/100) = 0.970) but 256 keeps half: the
    descent from 512 stops at 256, so 512 is named. SnapKV 256 keeps its 10 samples: a record without a
    loss needs 59 (0.95**59 = 0.0485 <= 0.05)."""
    url = database_url(tmp_path / "small.sqlite")
    with ResultsDB(url) as db:
        store(db, [*PASSKEY, "cache=full"], [1.0] * N)
        for budget, scores in {128: [1.0] * N, 256: [1.0, 0.0] * (N // 2), 512: [1.0] * N}.items():
            store(db, [*PASSKEY, "cache=snapstream", f"cache.budget={budget}"], scores)
        store(db, [*PASSKEY, "cache=snapkv", "cache.budget=256"], [1.0] * 10)
        document = build_report(db, (0.95,), figures=False)
    accuracy = tables(document, "llama-3.1-8b-instruct · ruler_passkey")[0]
    keeps = {
        label: row_of(accuracy, label)[6] for label in ("SnapStream 128", "SnapStream 256", "SnapKV 256")
    }
    assert keeps == {
        "SnapStream 128": Mark("yes", "pass"),
        "SnapStream 256": Mark("no", "fail"),
        "SnapKV 256": Mark("too few (needs 59)", "muted"),
    }
    assert decision_row(document, "SnapStream", "-")[5] == Mark("512 (retention 1.000)", "pass")
    assert decision_row(document, "SnapKV", "-")[5] == Mark("n too small: 10 of 59", "muted")


def decision_tables(blocks: list) -> list[tuple[Table, object]]:
    """Every decision table among ``blocks`` (the overview's, each experiment's) and the block after it."""
    blocks = [*blocks, None]
    return [
        (block, blocks[i + 1])
        for i, block in enumerate(blocks[:-1])
        if isinstance(block, Table) and block.header[-1].startswith("Retention ")
    ]


def test_a_decision_table_says_why_n_is_too_small_once_in_a_footnote(document, db_url, tmp_path):
    """A too-small cell is short (``n too small: k of m``); the table says what it means once, in the note
    under it, and a table without such a cell has no such note. The Markdown report says it as often."""
    tables_ = decision_tables(list(document.blocks))
    small = [table for table, _ in tables_ if any(TOO_SMALL in text(c) for row in table.rows for c in row)]
    assert len(tables_) > len(small) >= 2  # the overview, Llama 1024 tokens, ...; not Llama 2048 tokens
    for table, after in tables_:
        cells = [text(cell) for row in table.rows for cell in row]
        assert not any("cannot show" in cell or "needs >=" in cell for cell in cells)
        assert (after == Paragraph(TOO_SMALL_NOTE, note=True)) is (table in small)
    assert sum(isinstance(b, Paragraph) and b.text == TOO_SMALL_NOTE for b in document.blocks) == len(small)
    out = tmp_path / "report.md"
    assert main(["--db", db_url, "--out", str(out), "--markdown"]) == 0
    assert out.read_text(encoding="utf-8").count(TOO_SMALL_NOTE[:40]) == len(small)
    with ResultsDB(db_url) as db:
        decided = build_report(db, (0.7,), figures=False)
    [(table, after)] = decision_tables(section(decided, LLAMA_1024))  # decided at 0.7: no footnote
    assert [text(row[2]).split(" (")[0] for row in table.rows] == ["256", "128"]  # SnapKV, SnapStream
    assert not (isinstance(after, Paragraph) and TOO_SMALL in after.text)


def test_flipped_samples_lost_first_with_their_kept_histogram(document):
    [flips] = tables(document, "SnapStream 256: 2 of 100 paired samples flipped (1 lost, 1 gained)")
    assert [row[:2] for row in flips.rows] == [("passkey-5", "1 → 0"), ("passkey-98", "0 → 1")]
    assert flips.rows[0][3:5] == ("The answer is 5", "The answer is unknown")
    assert flips.rows[0][5] == Histogram(tuple(KEPT["bins"]), tuple(KEPT["counts"]))


def test_memory_per_sequence_and_rows_from_the_estimator(document):
    memory = next(t for t in tables(document, LLAMA_1024) if t.header[0] == "Cache")
    assert memory.header[2:] == ("rows, H100 HBM3", "rows, H200 HBM3e", "rows, SN40L HBM", "rows, SN40L DDR")
    full = estimate("llama-3.1-8b-instruct", "h100", context=1024)
    hbm = full.tiers[-1]
    assert row_of(memory, "Full cache")[1:3] == ("128 MiB", f"{hbm.max_sequences_full:,}")
    compressed = full.kv_bytes_per_sequence_full * KV_BYTES[256] / KV_BYTES["full"]
    row = row_of(memory, "SnapStream 256 (meets 0.95)")
    assert row[1:3] == (binary_size(compressed), f"{int(hbm.kv_available // compressed):,}")
    left_out = [b.text for b in section(document, "acme/tiny-base · aime24") if isinstance(b, Paragraph)]
    assert any("left out" in line and "no config for acme/tiny-base" in line for line in left_out)


def capacity_rows(tp: int, ratio: float) -> tuple[str, ...]:
    """The estimator's KV bytes per sequence on one rank and rows per socket at ``tp``, ``ratio`` times
    the full cache's: what the report's capacity table shows."""
    hardware = ("h100", "h200", "sn40l")
    estimates = [estimate("llama-3.1-8b-instruct", hw, context=1024, tp=tp) for hw in hardware]
    columns = [(e.kv_bytes_per_sequence_full_per_socket * ratio, t) for e in estimates for t in e.tiers]
    return (
        binary_size(columns[0][0]),
        *(f"{int(tier.kv_available // kv):,}" for kv, tier in columns if tier.name != "onchip"),
    )


def test_capacity_at_the_tensor_parallel_degree_the_runs_recorded(tmp_path, capsys):
    """Runs split over 2 ranks (``runs.tensor_parallel`` 2) size the table at tp=2: a rank's KV heads and
    half the weights, the estimator's rows at tp=2 and not tp=1. A compressed setting run at tp=1 against
    the full cache's tp=2 runs is sized by the ratio of their whole rows' KV bytes (``kv_bytes``, over
    every rank), and the table at the largest degree. NULL (a run from before TP) is tp=1."""
    url = database_url(tmp_path / "tp.sqlite")
    with ResultsDB(url, tensor_parallel=2) as db:
        store(db, [*PASSKEY, "cache=full"], FULL, KV_BYTES["full"])
        store(db, [*PASSKEY, "cache=snapstream", "cache.budget=256"], SNAPSTREAM[256], KV_BYTES[256])
        document = build_report(db, (0.95,), figures=False)
    [memory] = [t for t in tables(document, "llama-3.1-8b-instruct") if t.header[0] == "Cache"]
    assert memory.header[1] == "KV per sequence, one rank"
    ratio = KV_BYTES[256] / KV_BYTES["full"]
    assert row_of(memory, "Full cache")[1:] == capacity_rows(2, 1.0)
    assert row_of(memory, "SnapStream 256 (meets 0.95)")[1:] == capacity_rows(2, ratio)
    assert capacity_rows(2, 1.0) != capacity_rows(1, 1.0)  # half the KV heads and weights per socket
    assert row_of(memory, "Full cache")[1] == "64.00 MiB"  # 128 MiB over 2 ranks
    said = [b.text for b in section(document, "KV memory per sequence") if isinstance(b, Paragraph)]
    assert any("tp=2: the weights and KV heads split over 2 sockets, as the runs were" in t for t in said)
    assert any("bf16 KV, bf16 weights, tp=2" in t for t in said)  # the dtypes the estimator sized

    with ResultsDB(url) as db:  # a compressed setting at tp=1 beside the tp=2 full cache
        store(db, [*PASSKEY, "cache=snapkv", "cache.budget=256"], SNAPSTREAM[256], KV_BYTES[256])
        document = build_report(db, (0.95,), figures=False)
    [memory] = [t for t in tables(document, "llama-3.1-8b-instruct") if t.header[0] == "Cache"]
    assert row_of(memory, "Full cache")[1:] == capacity_rows(2, 1.0)
    assert row_of(memory, "SnapKV 256 (meets 0.95)")[1:] == capacity_rows(2, ratio)
    said = [b.text for b in section(document, "KV memory per sequence") if isinstance(b, Paragraph)]
    assert any("(runs at tp=1, 2: sized at the largest)" in t for t in said)

    with sqlite3.connect(tmp_path / "tp.sqlite") as conn:  # every run from before TP
        conn.execute("UPDATE runs SET tensor_parallel = NULL")
    with ResultsDB(url) as db:
        document = build_report(db, (0.95,), figures=False)
    [memory] = [t for t in tables(document, "llama-3.1-8b-instruct") if t.header[0] == "Cache"]
    assert memory.header[1] == "KV per sequence"
    assert row_of(memory, "Full cache")[1:] == capacity_rows(1, 1.0)
    said = [b.text for b in section(document, "KV memory per sequence") if isinstance(b, Paragraph)]
    assert any("one socket (tp=1)" in t for t in said)

    with sqlite3.connect(tmp_path / "tp.sqlite") as conn:  # a database from before the column
        conn.execute("ALTER TABLE runs DROP COLUMN tensor_parallel")
    out = tmp_path / "report.md"
    assert main(["--db", url, "--out", str(out), "--markdown"]) == 0
    markdown = out.read_text(encoding="utf-8")
    assert "one socket (tp=1)" in markdown and "| Full cache | 128 MiB |" in markdown


def test_provenance_traces_and_deviations(document, db_url):
    aime = section(document, "acme/tiny-base · aime24")
    traces = next(b for b in aime if isinstance(b, Table) and "Traces" in b.header)
    assert row_of(traces, "SnapStream 256")[1:5] == ("3", "900.0", "0.000", "1.000")
    provenance = next(b for b in aime if isinstance(b, Table) and "Config hash" in b.header)
    with ResultsDB(db_url) as db:
        stored = {run["config_hash"][:12] for run in db.run_states() if run["task"] == "aime24"}
    assert {row[1] for row in provenance.rows} == stored
    assert {row[-3] for row in provenance.rows} == {importlib.metadata.version("torch")}
    listed = " ".join(next(b for b in aime if isinstance(b, Bullets)).items)
    assert "revision (commit of the weights): not stored" in listed
    assert "Protocol preset aime24_r1: deviations from the official run: qwen_math_latex_parser" in listed
    assert "Scoring deviations stored with the samples: qwen_math_latex_parser." in listed
    assert "Accelerator: not stored" in listed


class Page(HTMLParser):
    """Every tag of a page with its attributes, and the text outside tags."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_the_html_is_one_self_contained_page(html, document):
    page = Page()
    page.feed(html)
    names = [tag for tag, _ in page.tags]
    assert (
        names.count("html") == 1 and "script" not in names and "link" not in names and "iframe" not in names
    )
    for _, attrs in page.tags:  # nothing fetched: every address in the page is a data URI or an anchor
        assert all("http" not in str(value) for value in attrs.values() if not str(value).startswith("data:"))
    assert "@import" not in html and "url(" not in html
    images = [attrs["src"] for tag, attrs in page.tags if tag == "img"]
    experiments_with_budgets = 4  # tiny-base, llama 1024, llama 2048, smollm2
    assert len(images) == experiments_with_budgets
    for source in images:
        assert source.startswith("data:image/svg+xml;base64,")
        svg = base64.b64decode(source.split(",", 1)[1])
        assert b"<svg" in svg and b"<image" not in svg and b'href="http' not in svg
    assert all(attrs["href"].startswith("#") for tag, attrs in page.tags if tag == "a")
    assert names.count("svg") == 5 + 2  # kept histograms: the flips shown of SnapStream 128 and 256
    shown = "".join(page.text)
    assert "passkey-98" in shown and "256 (retention 1.000)" in shown
    assert "@media print" in html


def test_the_markdown_report_has_the_same_numbers_and_no_html(db_url, tmp_path, capsys):
    out = tmp_path / "report.md"
    assert main(["--db", db_url, "--out", str(out), "--markdown"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (")
    markdown = out.read_text(encoding="utf-8")
    assert "<img" not in markdown and "<svg" not in markdown and "<table" not in markdown
    assert (
        "| Model | Task | Settings | Method | Full-cache accuracy | Retention 0.95 | Retention 0.99 |"
        in markdown
    )
    assert f"| SnapStream 256 | {N} | {interval(*mean_ci(SNAPSTREAM[256]))} |" in markdown
    assert f"| **256 (retention 1.000)** | {TOO_FEW_099} |" in markdown
    assert "| passkey-5 | 1 → 0 | 5 | The answer is 5 | The answer is unknown | █▁·▂·▂·▁▄█ |" in markdown
    assert "## llama-3.1-8b-instruct · ruler_passkey (task.context_length=1024)" in markdown


def test_gate_verdicts_on_the_stored_samples(db_url, tmp_path):
    """19 of 20 kept: lower bound 0.784 (p**20 + 20 p**19 (1 - p) = 0.05), so 0.75 passes, 0.8 is open
    (upper bound 1.201) and 1.0 can be shown by no finite sample."""
    spec = tmp_path / "gates.yaml"
    loose = {**SMOKE_GATE, "name": "loose", "min_retained": 0.75}
    strict = {**SMOKE_GATE, "name": "strict", "min_retained": 1.0}
    spec.write_text(yaml.safe_dump([loose, SMOKE_GATE, strict]))
    with ResultsDB(db_url) as db:
        document = build_report(db, (0.95,), figures=False, gates=load_gates(spec))
    [verdicts] = tables(document, "Accuracy gates")
    assert verdicts.header[5:7] == ("Retained", "95% lower bound")
    passed = row_of(verdicts, "loose")
    assert passed[1:3] == (Mark("PASS", "pass"), "20 (min 20)")
    assert passed[5:7] == ("0.950 (required 0.75)", "0.784 (pass)")
    assert [row_of(verdicts, name)[1] for name in ("passkey-smoke", "strict")] == [Mark("FAIL", "fail")] * 2
    assert [row_of(verdicts, name)[6] for name in ("passkey-smoke", "strict")] == [
        "0.784 (open)",
        "0.784 (too few)",
    ]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "--db: "),
        ("empty", "holds no scored samples: nothing to report"),
        ("targets", "--targets: must be finite numbers > 0"),
        ("out", "--out: cannot write the report"),
    ],
)
def test_errors_end_in_one_line_with_exit_code_2(case, message, db_url, tmp_path, capsys):
    db, out = db_url, tmp_path / "report.html"
    if case == "missing":
        db = str(tmp_path / "missing.sqlite")
    if case == "empty":
        db = str(tmp_path / "empty.sqlite")
        ResultsDB(db).close()
    if case == "out":
        out = tmp_path / "no such folder" / "report.html"
    args = ["--db", db, "--out", str(out), *(["--targets", "0.9", "nan"] if case == "targets" else [])]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1
    assert not out.exists()


def test_the_command_never_imports_torch(db_url, tmp_path, torch_refused):
    out = tmp_path / "report.html"
    command = [sys.executable, "-m", "snapeval.report", "--db", db_url, "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=torch_refused, timeout=120)
    assert result.returncode == 0, result.stderr
    assert out.read_text(encoding="utf-8").count("<img") == 4


def browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
def test_the_page_renders_in_headless_chromium(html, tmp_path):
    if browser() is None:
        pytest.skip("neither chromium nor chromium-browser is on PATH")
    image = pytest.importorskip("PIL.Image", reason="Pillow is not installed: the screenshot cannot be read")
    page, shot = tmp_path / "report.html", tmp_path / "shot.png"
    page.write_text(html, encoding="utf-8")
    command = [
        browser(),
        "--headless",
        "--no-sandbox",  # as root in a container
        "--disable-gpu",
        "--window-size=1280,2000",
        f"--screenshot={shot}",
        "--enable-logging=stderr",
        "--v=0",
        page.as_uri(),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    console = [line for line in result.stderr.splitlines() if re.search(r":CONSOLE[:(]|Uncaught", line)]
    assert not console  # the page logs nothing: no script, nothing that fails to load
    with image.open(shot) as screenshot:
        colours = screenshot.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 10  # None: more colours than counted


def test_under_torchrun_rank_0_alone_writes_the_report_and_the_figures(db_url, tmp_path, monkeypatch):
    """``torchrun ... -m snapeval.report`` (or figures): the other ranks read nothing and write nothing."""
    from snapeval.figures.command import main as figures

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main([f"--db={db_url}", f"--out={tmp_path / 'report.html'}"]) == 0
    assert figures([f"--db={db_url}", f"--out={tmp_path / 'figures'}"]) == 0
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("RANK", "0")
    assert main([f"--db={db_url}", f"--out={tmp_path / 'report.html'}"]) == 0
    assert (tmp_path / "report.html").stat().st_size > 0


def test_the_commands_default_outputs_are_never_committed():
    """``python -m snapeval.report`` writes report.html (report.md) where it runs: git ignores both at the
    checkout's root, and neither is committed there."""
    root = CONF_DIR.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    outputs = ["report.md", "report.html"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *outputs], cwd=root, capture_output=True)
    assert ignored.stdout.decode().split() == outputs
    tracked = subprocess.run(["git", "ls-files", "--", *outputs], cwd=root, capture_output=True, check=True)
    assert tracked.stdout.decode() == ""
