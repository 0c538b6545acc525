"""DeepSeek-V3 (671B, MLA) split over ranks by its plan, which keeps attention whole: each rank holds the
whole latent, so a rank's KV bytes are the whole row's, in what a sample stores, in the estimator's bytes
per socket, and in the report's KV per sequence and rows per accelerator; its weights per socket hold
the attention, routers and norms whole and split the rest (the MLPs, experts, embeddings and LM head).

The rows are made as a rank makes them (:func:`across_ranks` on the latent slots a rank's row holds, then
:func:`sample_row`), without running a model; tests/test_tensor_parallel_memory.py runs a tiny DeepSeek-V3
on 2 ranks against the same arithmetic."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import transformers

from snapeval.configs.compose import compose_config
from snapeval.decode.continuous.rows import across_ranks
from snapeval.decode.continuous.work import Answer, Request
from snapeval.memory import estimate, load_geometry
from snapeval.memory.catalogue import shipped_config
from snapeval.report import build_report
from snapeval.report.document import Table, binary_size
from snapeval.results import ResultsDB, database_url, identity
from snapeval.run.records import sample_row
from snapeval.tasks import Prompt
from tests.test_kv_over_ranks import LETTERS, TASK

SLOT = 61 * (512 + 64) * 2  # one latent slot over 61 layers, bf16: 70,272 bytes
CONTEXT = 512
PASSKEY = ["model=deepseek-v3", "task=ruler_passkey", f"task.context_length={CONTEXT}"]
V3 = transformers.DeepseekV3Config(
    **{k: v for k, v in shipped_config("deepseek-ai/DeepSeek-V3").items() if k[0] != "_"}
)


def rank_row(sample_id: str, slots: int, tp: int) -> dict:
    """The row rank 0 of a TP=``tp`` run stores for a sample whose row held ``slots`` latent slots."""
    model = SimpleNamespace(_tp_size=tp, config=V3)
    answer = Answer(
        Request((1,) * CONTEXT, {"method": "full"}, 4), [5], "eos", 0.1, 0.2, slots * SLOT, 0, None
    )
    answer = across_ranks(answer, model, 1)  # one latent cache head, on every rank
    return sample_row(TASK, Prompt(sample_id, [], "x"), [answer], None, LETTERS, torch.device("cpu"))


def test_a_rank_stores_the_whole_latent_once():
    row = rank_row("passkey-0", 128, 8)
    assert row["kv_bytes"] == row["kv_bytes_per_rank"] == 128 * SLOT


def test_the_report_and_the_estimator_count_the_latent_once_per_rank(tmp_path):
    url = database_url(tmp_path / "v3.sqlite")
    for overrides, slots in ((["cache=full"], CONTEXT), (["cache=snapstream", "cache.budget=128"], 128)):
        config, digest = identity(compose_config(*PASSKEY, *overrides))
        with ResultsDB(url, tensor_parallel=2) as db:
            run_id = db.start_run(config, digest)
            for index in range(4):
                db.add_sample(run_id, digest, rank_row(f"passkey-{index}", slots, 2))
            db.finish_run(run_id)
    with ResultsDB(url) as db:
        document = build_report(db, (0.5,), figures=False)
    table = next(b for b in document.blocks if isinstance(b, Table) and b.header[0] == "Cache")
    assert table.header[1] == "KV per sequence, one rank"
    full = estimate("deepseek-v3", "h200", context=CONTEXT, tp=2)
    assert full.kv_bytes_per_sequence_full_per_socket == full.kv_bytes_per_sequence_full == CONTEXT * SLOT
    [row] = [row for row in table.rows if row[0] == "Full cache"]
    assert row[1] == binary_size(CONTEXT * SLOT)
    hbm = next(tier for tier in full.tiers if tier.name == "hbm")
    column = table.header.index(f"rows, H200 {hbm.label}")
    assert row[column] == f"{hbm.kv_available // (CONTEXT * SLOT):,}"


def test_the_weights_per_rank_keep_mla_attention_routers_and_norms_whole():
    geometry = load_geometry("deepseek-v3")
    assert dict(geometry.replicated) == {
        "attention": 61 * 187_107_328,  # q_a, q_b, kv_a, kv_b, o and their norms, per layer
        "routers": 58 * 7168 * 256,
        "norms": 123 * 7168,
    }
    whole = geometry.replicated_parameters
    for tp in (8, 16):
        weights = estimate(
            geometry, "h200", context=CONTEXT, tp=tp, weights_dtype="fp8"
        ).weights_bytes_per_socket
        assert weights == whole + -(-(671 * 10**9 - whole) // tp)
