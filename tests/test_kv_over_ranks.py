"""KV bytes of runs at different TP degrees compare: a sample stores its whole row's KV bytes (over every
rank) and one rank's share, and the summary, the report's accuracy table and its capacity table read the
whole row's, never averaging a rank's share with a whole model's.

The rows are made as a rank makes them (:func:`across_ranks` on the share a rank's row holds, then
:func:`sample_row`) for the embedded SmolLM2-135M (9 query and 3 KV heads, 30 layers of head_dim 64, fp32),
without running a model; a TP=3 rank holds one KV head. Older databases, whose ``kv_bytes`` was a rank's
share, read and upgrade as :func:`snapeval.results.schema.stored_before` says."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import pytest
import torch
import transformers

from snapeval.configs.compose import compose_config
from snapeval.decode.continuous.rows import across_ranks
from snapeval.decode.continuous.work import Answer, Request
from snapeval.memory import estimate
from snapeval.report import build_report
from snapeval.report.document import Table, binary_size
from snapeval.results import ResultsDB, database_url, identity, load, summarize
from snapeval.results.__main__ import main as results_main
from snapeval.run.records import sample_row
from snapeval.tasks import Prompt

SMOLLM = transformers.LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64)
KV_HEADS = 3
SLOT = 2 * 30 * KV_HEADS * 64 * 4  # keys and values of one token on one device: 46,080 bytes
FULL_SLOTS = 535  # a 512-token passkey prompt and its answer: 23.5 MiB
PASSKEY = ["model=smollm2-135m", "task=ruler_passkey", "task.context_length=512"]
SNAPSTREAM = ["cache=snapstream", "cache.budget=128"]
LETTERS = SimpleNamespace(decode=lambda tokens, skip_special_tokens=True: "the answer")
TASK = SimpleNamespace(score_turns=lambda prompt, outputs: {"score": 1.0}, deviations=(), answer_pass=None)


def rank_row(sample_id: str, slots: int, tp: int) -> dict:
    """The row rank 0 of a TP=``tp`` run stores for a sample whose row held ``slots`` slots: its answer's
    bytes over its own KV heads, made the model's by :func:`across_ranks`, then :func:`sample_row`."""
    model = SimpleNamespace(_tp_size=tp, config=SMOLLM)
    heads_here = KV_HEADS // tp
    share = slots * SLOT * heads_here // KV_HEADS
    answer = Answer(Request((1,) * 512, {"method": "full"}, 4), [5], "eos", 0.1, 0.2, share, 0, None)
    answer = across_ranks(answer, model, heads_here)
    return sample_row(TASK, Prompt(sample_id, [], "x"), [answer], None, LETTERS, torch.device("cpu"))


def store(url: str, overrides: list[str], ids: range, slots: int, tp: int) -> None:
    """A run at ``tp`` of the config of ``overrides`` storing samples ``passkey-<i>`` for ``ids``."""
    config, digest = identity(compose_config(*PASSKEY, *overrides))
    with ResultsDB(url, tensor_parallel=tp) as db:
        run_id = db.start_run(config, digest)
        for index in ids:
            db.add_sample(run_id, digest, rank_row(f"passkey-{index}", slots, tp))
        db.finish_run(run_id)


def accuracy_table(document) -> Table:
    return next(b for b in document.blocks if isinstance(b, Table) and "KV MiB" in b.header)


def capacity_table(document) -> Table:
    return next(b for b in document.blocks if isinstance(b, Table) and b.header[0] == "Cache")


def kv_mib(table: Table, label: str) -> str:
    row = next(row for row in table.rows if str(row[0]).startswith(label))
    return row[table.header.index("KV MiB")]


def test_a_rank_stores_the_whole_rows_kv_bytes_and_its_share():
    """At TP=3 a rank's row holds one of the 3 KV heads: the sample stores 3 times its bytes as the
    whole row's, its own as the share; a family that keeps every KV head on every rank stores its share as
    the whole (one device's row, not the ranks' sum); on one device both are the row's."""
    whole = 128 * SLOT
    split = rank_row("passkey-0", 128, 3)
    assert (split["kv_bytes"], split["kv_bytes_per_rank"]) == (whole, whole // 3)
    one = rank_row("passkey-0", 128, 1)
    assert (one["kv_bytes"], one["kv_bytes_per_rank"]) == (whole, whole)
    answer = Answer(Request((1, 2), {"method": "full"}, 4), [5], "eos", 0.1, 0.2, whole, 0, None)
    held = across_ranks(answer, SimpleNamespace(_tp_size=3, config=SMOLLM), KV_HEADS)  # Phi-3's plan
    assert (held.kv_bytes, held.kv_bytes_per_rank) == (whole, whole)


@pytest.fixture
def mixed(tmp_path) -> str:
    """The issue's case: the full cache at TP=1 on 4 samples; SnapStream 128 at TP=3 on 2 of them, then
    without TP on the other 2."""
    url = database_url(tmp_path / "mixed.sqlite")
    store(url, ["cache=full"], range(4), FULL_SLOTS, 1)
    store(url, SNAPSTREAM, range(2), 128, 3)
    store(url, SNAPSTREAM, range(2, 4), 128, 1)
    return url


def test_the_summary_and_the_report_average_whole_rows_over_tp_degrees(mixed, capsys):
    """SnapStream 128 shows 5.6 MiB (128 slots of 46,080 bytes on every sample), not 3.8 (the mean of a
    rank's 1.9 and the whole 5.6), in the summary, the results summary and the report."""
    summary = summarize(load(mixed)).set_index("method")["kv_mib"]
    assert summary["snapstream"] == 128 * SLOT / 2**20 == 5.625
    assert summary["full"] == FULL_SLOTS * SLOT / 2**20
    assert results_main(["summary", "--db", mixed]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, _, *rows = ([cell.strip() for cell in line.split("|")[1:-1]] for line in lines)
    shown = {row[header.index("method")]: row[header.index("KV MiB")] for row in rows}
    assert (shown["full"], shown["snapstream"]) == ("23.5", "5.6")
    with ResultsDB(mixed) as db:
        table = accuracy_table(build_report(db, (0.95,), figures=False))
    assert (kv_mib(table, "Full cache"), kv_mib(table, "SnapStream 128")) == ("23.5", "5.6")
    stored = load(mixed)
    shares = stored[stored["cache.method"] == "snapstream"]["kv_bytes_per_rank"].tolist()
    assert shares == [128 * SLOT // 3] * 2 + [128 * SLOT] * 2  # each rank's share, as stored


def test_a_setting_at_tp3_alone_compares_with_a_full_cache_at_tp1(tmp_path):
    """The full cache at TP=1 only, SnapStream 1024 at TP=3 only: the accuracy table shows SnapStream's
    whole rows (45.0 MiB, not a rank's 15.0), and the capacity table sizes it at tp=3 from the ratio of
    whole rows (not "not comparable")."""
    url = database_url(tmp_path / "apart.sqlite")
    store(url, ["cache=full"], range(8), FULL_SLOTS, 1)
    store(url, ["cache=snapstream", "cache.budget=1024"], range(8), 1024, 3)
    with ResultsDB(url) as db:
        document = build_report(db, (0.5,), figures=False)
    table = accuracy_table(document)
    assert (kv_mib(table, "Full cache"), kv_mib(table, "SnapStream 1024")) == ("23.5", "45.0")
    capacity = capacity_table(document)
    assert capacity.header[1] == "KV per sequence, one rank"
    [row] = [row for row in capacity.rows if row[0] == "SnapStream 1024 (meets 0.5)"]
    full = estimate("smollm2-135m", "h100", context=512, tp=3)
    assert row[1] == binary_size(full.kv_bytes_per_sequence_full_per_socket * 1024 / FULL_SLOTS)


def test_an_older_database_reads_a_ranks_share_as_the_share_alone(tmp_path):
    """A database from before ``kv_bytes_per_rank`` held a rank's share in ``kv_bytes``: read, and once a
    writer opens it, that share is the sample's ``kv_bytes_per_rank`` and its whole row is unknown (NULL)
    at TP=3, while a sample without TP keeps its bytes as both. With no ``runs.tensor_parallel`` either
    (before TP), every sample's bytes are both."""
    path = tmp_path / "old.sqlite"
    store(database_url(path), SNAPSTREAM, range(2), 128, 3)
    store(database_url(path), SNAPSTREAM, range(2, 4), 128, 1)
    with sqlite3.connect(path) as conn:  # as the older snapeval stored them
        conn.execute("UPDATE samples SET kv_bytes = kv_bytes_per_rank")
        conn.execute("ALTER TABLE samples DROP COLUMN kv_bytes_per_rank")
    expected = ([None, None, 128 * SLOT, 128 * SLOT], [128 * SLOT // 3] * 2 + [128 * SLOT] * 2)

    def stored() -> tuple[list, list]:
        frame = load(path).astype(object).where(lambda f: f.notna(), None)
        return frame["kv_bytes"].tolist(), frame["kv_bytes_per_rank"].tolist()

    assert stored() == expected  # read as it stands
    assert summarize(load(path))["kv_mib"].tolist() == [128 * SLOT / 2**20]  # the TP=1 samples alone
    ResultsDB(path).close()  # a writer upgrades it
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT kv_bytes, kv_bytes_per_rank FROM samples ORDER BY id").fetchall() == list(
            zip(*expected, strict=True)
        )
    assert stored() == expected
    ResultsDB(path).close()  # a second writer changes nothing
    assert stored() == expected

    with sqlite3.connect(path) as conn:  # before TP: no runs.tensor_parallel
        conn.execute("ALTER TABLE samples DROP COLUMN kv_bytes_per_rank")
        conn.execute("ALTER TABLE runs DROP COLUMN tensor_parallel")
        conn.execute(f"UPDATE samples SET kv_bytes = {SLOT}")
    assert stored() == ([SLOT] * 4, [SLOT] * 4)
    ResultsDB(path).close()
    assert stored() == ([SLOT] * 4, [SLOT] * 4)
