"""Memory per rank under tensor parallel (issue 47, item 4), on 2 gloo ranks
(``torchrun --standalone --nproc-per-node 2 tests/tensor_parallel_memory_worker.py``):

* The batcher's pre-flight check decides alike on every rank when the ranks read different free memory:
  each rank is told its own figure, and both refuse, or both allocate, on the least free of any rank (a
  rank that refuses alone would leave the other waiting in a collective).
* The memory estimator's ``tp`` and a run's world agree on one model: a tiny random Llama of 8 query and
  4 KV heads, saved with ``save_pretrained``; the ``kv_bytes_per_rank`` each rank stores for a row of a
  TP=2 run is the estimator's bytes per sequence per socket at ``tp=2`` (half of TP=1's, which is
  ``tp=1``'s), its ``kv_bytes`` the estimator's whole sequence (TP=1's, on every rank), and the check's
  bytes of a row on a rank are a rank's KV bytes, the rank's positions and the row's valid flags.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from snapeval.decode import batch_rows
from snapeval.memory import estimate, kv_bytes_per_sequence
from snapeval.memory.geometry import load_geometry
from snapeval.memory.kv import kv_heads_per_rank
from tests import tensor_parallel_memory_worker as worker
from tests.families import FAMILIES

WORKER = Path(worker.__file__)
TIMEOUT_S = 240
KV_DTYPE = "fp32"  # the tiny model's
HARDWARE = "h100"  # any profile: the bytes of a sequence do not depend on it

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]  # a torchrun: .ci/run runs it


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny random Llama of 8 query and 4 KV heads (head_dim 8, 2 layers), saved."""
    config = transformers.LlamaConfig(
        vocab_size=worker.VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=8,
    )
    folder = tmp_path_factory.mktemp("tensor_parallel_memory") / "llama"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def mla_folder(tmp_path_factory) -> Path:
    """The tiny random DeepSeek-V3 of tests/families.py, saved."""
    folder = tmp_path_factory.mktemp("tensor_parallel_memory") / "deepseek_v3"
    FAMILIES["deepseek_v3"](worker.VOCAB).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def ranks(folder) -> list[dict]:
    return ranks_of(folder)


@pytest.fixture(scope="module")
def mla_ranks(mla_folder) -> list[dict]:
    return ranks_of(mla_folder)


def ranks_of(folder: Path) -> list[dict]:
    """What each of 2 ranks reports (tests/tensor_parallel_memory_worker.py) on the model in ``folder``."""
    out = folder.parent / "tp2"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += [f"--log-dir={out / 'logs'}", "--redirects=3", str(WORKER), str(out), str(folder)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=environment)
    logs = "\n".join(log.read_text()[-2000:] for log in sorted((out / "logs").rglob("std*.log")))
    assert done.returncode == 0, done.stderr[-3000:] + logs
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_the_check_decides_alike_on_ranks_that_read_different_free_memory(ranks):
    first, second = (rank["decisions"] for rank in ranks)
    assert first == second
    assert first["both plenty"] == "fits"
    for case in ("rank 1 short", "rank 0 short", "rank 1 cannot tell"):  # the least free of any rank
        assert first[case].startswith("run.batch_size: 4 rows of 64 slots take"), (case, first[case])
        assert "not even one fits" in first[case]


def test_the_estimators_tp_gives_the_kv_bytes_a_tp2_run_stores_per_rank_and_whole(ranks, folder, tmp_path):
    single = worker.main(str(tmp_path), str(folder))["rows"]  # a world of one, in this process
    assert single["kv_heads"] == 4
    for rank in ranks:
        assert rank["rows"]["kv_heads"] == kv_heads_per_rank(4, 2) == 2
        assert rank["rows"]["kv_bytes_per_rank"] == {t: b // 2 for t, b in single["kv_bytes"].items()}
    assert_rows_as_estimated(load_geometry(str(folder)), single, ranks)


def test_under_mla_a_rank_stores_holds_and_is_estimated_the_whole_latent_and_its_share_of_weights(
    mla_ranks, mla_folder, tmp_path
):
    single = worker.main(str(tmp_path), str(mla_folder))["rows"]
    geometry = load_geometry(str(mla_folder))
    assert single["kv_heads"] == 1 and all(rank["rows"]["kv_heads"] == 1 for rank in mla_ranks)
    for rank in mla_ranks:
        assert rank["rows"]["kv_bytes_per_rank"] == single["kv_bytes"]  # the latent, once per rank
    assert_rows_as_estimated(geometry, single, mla_ranks)
    split = [rank["rows"]["weights_bytes"] for rank in mla_ranks]
    whole = geometry.replicated_parameters * 4  # fp32: attention, routers and norms on every rank
    assert split == [whole + (single["weights_bytes"] - whole) // 2] * 2
    for tp, weights in ((1, [single["weights_bytes"]]), (2, split)):
        expected = estimate(geometry, HARDWARE, context=8, tp=tp, weights_dtype=KV_DTYPE)
        assert weights == [expected.weights_bytes_per_socket] * tp, tp


def assert_rows_as_estimated(geometry, single: dict, ranks: list[dict]) -> None:
    """Each rank's stored KV bytes (its share and the whole row's), and the check's bytes of its rows, are
    the estimator's at its TP degree: TP=1 (``single``, this process) and TP=2 (``ranks``)."""
    prompt, decoded = worker.PROMPT_LENGTH, worker.NEW_TOKENS - 1  # the last token is never fed
    for tp, rows_of_ranks in ((1, [single]), (2, [rank["rows"] for rank in ranks])):
        for rank, rows in enumerate(rows_of_ranks):
            where = f"TP={tp}, rank {rank}"
            stored, whole = rows["kv_bytes_per_rank"], rows["kv_bytes"]
            assert whole == single["kv_bytes"] == single["kv_bytes_per_rank"], where  # TP=1's, whole
            # a full row holds the prompt and the tokens it fed
            full = estimate(geometry, HARDWARE, context=prompt + decoded, tp=tp, kv_dtype=KV_DTYPE)
            assert stored["full"] == full.kv_bytes_per_sequence_full_per_socket, where
            assert whole["full"] == full.kv_bytes_per_sequence_full, where
            for method in ("streaming_llm", "rkv", "snapkv"):
                budget = worker.SETTINGS[method]["budget"]
                rank_row = estimate(
                    geometry, HARDWARE, context=prompt, tp=tp, method=method, budget=budget, kv_dtype=KV_DTYPE
                )
                expected = rank_row.kv_bytes_per_sequence_compressed_per_socket
                expected_whole = rank_row.kv_bytes_per_sequence_compressed
                if method == "snapkv":  # its row grows past the budget by the tokens it decodes
                    expected += decoded * rank_row.kv_bytes_per_token_per_socket
                    expected_whole += decoded * rank_row.kv_bytes_per_token
                assert (stored[method], whole[method]) == (expected, expected_whole), (where, method)
            for tag, slots in rows["slots"].items():  # the check's row: KV bytes, positions, valid flags
                kv = kv_bytes_per_sequence(geometry, slots, KV_DTYPE, tp=tp)
                positions = slots * geometry.num_layers * rows["kv_heads"] * batch_rows.POSITION_BYTES
                flags = slots * batch_rows.FLAG_BYTES  # one ring of the row's slots: every layer is full
                assert rows["row_bytes"][tag] == kv + positions + flags, (where, tag)
                assert rows["row_bytes"][tag] >= stored[tag], (where, tag)
