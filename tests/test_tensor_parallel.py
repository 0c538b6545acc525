"""Tensor parallel under torchrun (issue 47): tiny random models of the families whose transformers classes
carry a TP plan, saved to folders and loaded with ``from_pretrained``'s TP plan on 2 gloo ranks
(``torchrun --standalone --nproc-per-node 2 tests/tensor_parallel_worker.py``), against the same folders
loaded on one process.

* Every method (kvpress aside: an optional extra) answers under TP=2 token for token as under TP=1, with
  logits within 1e-5 of the largest, on both ranks: the one-by-one generator, the continuous batcher with
  each method alone, every method in rows of one shared prefill, R-KV re-selecting while decoding, and
  sampled decoding (the generator, and batcher rows of two seeds).
* Several turns on one compressed context (full, SnapKV, SnapStream, StreamingLLM: 2-3 turns, beside a
  one-turn row) answer every turn under TP=2 as under TP=1 on both ranks, with the same whole-row KV bytes.
  Each method evicts (its logits move off the full cache's), so the equality is not that of full caches.
* A head count the world does not divide is refused in one line on every rank, exit 2, before weights load;
  so are a plan that splits MLA attention (DeepSeek-V2's), a family without a TP plan, and a mixture of
  experts below the transformers that splits it exactly (from the config alone). DeepSeek-V3's plan, which
  keeps attention whole, is taken (tests/test_tensor_parallel_moe.py runs it).
* The launcher's world is read from torchrun's variables.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from snapeval.cli.world import World, launcher_world, writing_rank
from snapeval.couplings import MOE_TENSOR_PARALLEL, at_least
from snapeval.errors import SnapevalError
from snapeval.memory.geometry import sliding_window_layers
from snapeval.models.parallel import check_tensor_parallel, tp_load_arguments
from tests import tensor_parallel_worker as worker
from tests.families import FAMILIES

DEFAULT_FAMILIES = ("llama",)
"""In the default run: heads split (Llama)."""
MORE_FAMILIES = ("gemma3", "phi4_mini", "qwen2", "qwen3", "mistral") + (
    ("gpt_oss",) if at_least(MOE_TENSOR_PARALLEL) else ()  # below, refused: a test here shows why
)
"""In the slow run (``.ci/run`` runs it): sliding windows beside full layers (Gemma 3), heads kept whole on
every rank (Phi-4-mini's gathered qkv_proj), more families whose plan splits heads, and GPT-OSS, which
splits its experts alone (from the release that splits them exactly)."""
TP_FAMILIES = (*DEFAULT_FAMILIES, *(pytest.param(f, marks=pytest.mark.slow) for f in MORE_FAMILIES))
WORKER = Path(worker.__file__)
TOLERANCE = 1e-5  # of the largest logit
TIMEOUT_S = 240

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def torchrun(
    ranks: int, out: Path, *folders: Path, options: tuple[str, ...] = (), timeout_s: float = TIMEOUT_S
) -> subprocess.CompletedProcess:
    """The worker on ``ranks`` gloo processes; each rank's stderr in ``out/logs/.../<rank>/stderr.log``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    command += [f"--log-dir={out / 'logs'}", "--redirects=2", str(WORKER), str(out), *options]
    command += map(str, folders)
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=environment)


def rank_errors(out: Path) -> dict[str, list[str]]:
    """Rank -> the lines it wrote to stderr."""
    logs = sorted((out / "logs").rglob("stderr.log"))
    return {log.parent.name: log.read_text().splitlines() for log in logs}


@pytest.fixture(scope="module")
def default_runs(tmp_path_factory):
    return compared_runs(tmp_path_factory, DEFAULT_FAMILIES)


@pytest.fixture(scope="module")
def more_runs(tmp_path_factory):
    return compared_runs(tmp_path_factory, MORE_FAMILIES)


@pytest.fixture
def runs(request, family):
    """The runs of ``family``'s group (one torchrun per group)."""
    return request.getfixturevalue("default_runs" if family in DEFAULT_FAMILIES else "more_runs")


def compared_runs(tmp_path_factory, families):
    """(TP=1 results, [TP=2 rank 0's, rank 1's]) of ``families``: the worker's ``runs``, (family, method,
    path) -> (tokens, logits per forward), and ``turns``, family -> (answers of several turns, logits)."""
    root = tmp_path_factory.mktemp("tensor_parallel")
    folders = saved(root, {name: FAMILIES[name] for name in families})
    single, [ranks] = split_runs(root, folders, [()])
    return single, ranks


def saved(root: Path, builders: dict) -> list[Path]:
    """Each family's tiny model (``builders``: name -> builder(vocab)) saved in ``root/<name>``."""
    for name, build in builders.items():
        build(worker.VOCAB).save_pretrained(root / name)
    return [root / name for name in builders]


def split_runs(
    root: Path, folders: list[Path], launches: list[tuple[str, ...]], timeout_s: float = TIMEOUT_S
):
    """The worker's results (``runs`` and ``kept``) on ``folders`` in this process (a world of one), and
    [rank 0's, rank 1's] of a 2-rank torchrun per worker options of ``launches`` (``--style=ep``)."""
    launched = []
    for index, options in enumerate(launches):
        out = root / f"tp2-{index}"
        split = torchrun(2, out, *folders, options=options, timeout_s=timeout_s)
        logs = "\n".join(log.read_text()[-2000:] for log in sorted((out / "logs").rglob("std*.log")))
        assert split.returncode == 0, split.stderr[-3000:] + logs
        launched.append([torch.load(out / f"rank{rank}.pt") for rank in range(2)])
    return worker.main(str(root / "tp1"), [str(folder) for folder in folders]), launched


@pytest.mark.parametrize("family", TP_FAMILIES)
def test_every_method_under_tp2_answers_as_under_tp1_on_every_rank(runs, family):
    single, ranks = runs
    keys = [key for key in single["runs"] if key[0] == family]
    assert len(keys) == 2 * len(worker.SETTINGS) + 3
    assert_answers_alike(single["runs"], [rank["runs"] for rank in ranks], keys)


@pytest.mark.parametrize("family", TP_FAMILIES)
def test_several_turns_on_one_compressed_context_answer_under_tp2_as_under_tp1_on_every_rank(runs, family):
    """The worker's rows of several turns: every rank's follow-ups, turns, stops and whole-row KV bytes are
    the one process's (logits within :data:`TOLERANCE`); each request answered all its turns, one turn
    ended on the token its follow-up starts with; where no layer slides (a sliding layer holds its window),
    the full row holds the whole conversation and each compressed row less than the one-turn full row."""
    single, ranks = runs
    assert_answers_alike(single["turns"], [rank["turns"] for rank in ranks], [family])
    one_turn, *several = single["turns"][family][0]
    assert [len(turns) for _, turns, _, _ in several] == list(worker.TURNS.values())
    assert any("eos" in stopped for _, _, stopped, _ in several)
    followups, turns, stopped, full_bytes = several[0]
    end = followups[0][0]  # ends a turn: fed once where the follow-up starts with it, else before it
    answered = sum(
        len(answer) + len(fed) + (stop == "eos" and fed[0] != end)
        for answer, fed, stop in zip(turns[:-1], followups, stopped[:-1], strict=True)
    )
    conversation = worker.PROMPT_LENGTH + answered + len(turns[-1]) - (stopped[-1] == "length")
    config = FAMILIES[family](worker.VOCAB).config
    if sliding_window_layers(config.to_dict(), config.num_hidden_layers) == (None, 0):
        assert full_bytes * (worker.PROMPT_LENGTH + worker.NEW_TOKENS - 1) == one_turn[-1] * conversation
        assert all(kv_bytes < one_turn[-1] for *_, kv_bytes in several[1:])  # each compressed row evicted


def assert_answers_alike(single: dict, ranks: list[dict], keys: list[tuple]) -> None:
    """Every rank's runs of ``keys`` gave the one process's tokens, and logits within :data:`TOLERANCE`
    of the largest."""
    for rank, split in enumerate(ranks):
        for key in keys:
            (tokens, logits), (got_tokens, got_logits) = single[key], split[key]
            assert got_tokens == tokens, f"rank {rank}: {key} generated other tokens"
            assert [x.shape for x in got_logits] == [x.shape for x in logits], f"rank {rank}: {key}"
            largest = max(x.abs().max().item() for x in logits)
            error = max((x - y).abs().max().item() for x, y in zip(got_logits, logits, strict=True))
            assert error <= TOLERANCE * largest, f"rank {rank}: {key}: logits differ by {error:.2e}"


@pytest.mark.parametrize("family", TP_FAMILIES)
def test_every_method_evicts_so_that_the_equality_is_not_that_of_full_caches(runs, family):
    single = runs[0]["runs"]
    full = single[family, "full", "generate"][1][-worker.NEW_TOKENS :]
    for method in worker.SETTINGS:
        if method == "full":
            continue
        logits = single[family, method, "generate"][1][-worker.NEW_TOKENS :]
        change = max((x - y).abs().max().item() for x, y in zip(logits, full, strict=True))
        assert change > 1e-3, f"{family}: {method} evicted nothing?"


@pytest.mark.slow  # .ci/run runs it
def test_a_head_count_the_world_does_not_divide_is_refused_in_one_line_on_every_rank(tmp_path):
    config = transformers.LlamaConfig(
        vocab_size=worker.VOCAB,
        hidden_size=96,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=3,  # as SmolLM2-135M: 9 query and 3 KV heads
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    refused = torchrun(2, tmp_path / "out", tmp_path / "llama")
    assert refused.returncode != 0
    errors = rank_errors(tmp_path / "out")
    assert sorted(errors) == ["0", "1"], refused.stderr[-3000:]
    expected = (
        "error: model.tp: llama has 6 query and 3 KV heads: 2 ranks cannot split its 3 KV heads "
        "(ranks that can: 3)"
    )
    assert all(lines == [expected] for lines in errors.values()), errors
    assert "exitcode  : 2" in refused.stderr
    assert not (tmp_path / "out" / "rank0.pt").exists()


def test_refusals_read_from_the_config_alone():
    smollm2 = transformers.LlamaConfig(num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    check_tensor_parallel(smollm2, 1)
    check_tensor_parallel(smollm2, 3)
    with pytest.raises(SnapevalError, match=r"^model\.tp: llama has 9 query and 3 KV heads: 2 ranks cannot"):
        check_tensor_parallel(smollm2, 2)
    with pytest.raises(SnapevalError, match="cannot split its 32 query heads"):
        check_tensor_parallel(transformers.LlamaConfig(num_attention_heads=32, num_key_value_heads=4), 3)
    falcon = transformers.FalconConfig()
    with pytest.raises(SnapevalError, match=r"^model\.tp: falcon: transformers has no tensor-parallel plan"):
        check_tensor_parallel(falcon, 2)
    check_tensor_parallel(transformers.Gemma3Config(), 2)  # a multimodal wrapper: its text model's plan
    moe = transformers.Qwen3MoeConfig(num_attention_heads=4, num_key_value_heads=2)
    mla = transformers.DeepseekV3Config()  # 128 heads, 256 experts
    if at_least(MOE_TENSOR_PARALLEL):
        check_tensor_parallel(moe, 2)
        check_tensor_parallel(mla, 16)  # its plan keeps MLA attention whole: every rank holds the latent
        with pytest.raises(
            SnapevalError,
            match=r"^model\.tp: deepseek_v2: transformers' TP plan splits MLA attention \(self_attn kv_a",
        ):
            check_tensor_parallel(transformers.DeepseekV2Config(), 2)  # q_b_proj, kv_b_proj colwise
    else:
        for config, text in ((moe, "qwen3_moe: tensor parallel over its 128 experts"), (mla, "deepseek_v3")):
            with pytest.raises(SnapevalError, match=rf"^model\.tp: {text}"):
                check_tensor_parallel(config, 2)


def test_the_world_is_torchruns():
    assert launcher_world({}) == World(1, 0, 0)
    world = launcher_world({"WORLD_SIZE": "3", "RANK": "2", "LOCAL_RANK": "0"})
    assert world == World(3, 2, 0) and world.parallel and not writing_rank(world)
    assert writing_rank(launcher_world({"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0"}))
    for bad in ({"WORLD_SIZE": "two"}, {"WORLD_SIZE": "2", "RANK": "2"}, {"WORLD_SIZE": "0"}):
        with pytest.raises(SnapevalError, match=r"^model\.tp: "):
            launcher_world(bad)
    assert tp_load_arguments(World()) == {}
    arguments = tp_load_arguments(World(2, 0, 0))
    plan = arguments.get("tp_plan") or arguments["distributed_config"].tp_plan
    assert plan == "auto"


RUN = ("run.limit=2", "task.context_length=512", "cache=snapstream", "cache.budget=128", "run.progress=false")


def test_a_tp2_run_stores_the_rows_of_a_tp1_run_and_rank_0_alone_writes(tiny_llama_overrides, tmp_path):
    """``torchrun --nproc-per-node 2 -m snapeval ...``: the same samples (outputs, scores, tokens) as the
    one-process command, under the same config hash; runs record their TP degree; only rank 0 prints."""
    stored, printed = stored_runs([*tiny_llama_overrides, *RUN], tmp_path)
    assert "random-llama" in printed["0"] and printed["1"] == ""
    assert_same_samples(stored)
    # its KV bytes: the whole row's alike, and a rank's share half of them (its 1 of 2 KV heads)
    assert [whole for whole, _ in stored["tp2"][2]] == [whole for whole, _ in stored["tp1"][2]]
    assert [2 * share for _, share in stored["tp2"][2]] == [share for _, share in stored["tp1"][2]]
    assert all(whole == share for whole, share in stored["tp1"][2])


SAMPLE_COLUMNS = (
    "sample_id, config_hash, prompt_tokens, output, target, score, metrics, generated_tokens, extra"
)
"""Every column of a sample but its seconds and memory (run metadata) and its KV bytes."""


def stored_runs(overrides: list[str], tmp_path: Path, timeout_s: float = TIMEOUT_S) -> tuple[dict, dict]:
    """``python -m snapeval`` and ``torchrun --nproc-per-node 2 -m snapeval`` of ``overrides``: what
    each stored ({"tp1"|"tp2": (samples' :data:`SAMPLE_COLUMNS`, runs' status and TP degree, samples'
    kv_bytes and kv_bytes_per_rank)}) and what each rank printed."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = [sys.executable, "-m", "snapeval", *overrides, f"run.db={tmp_path / 'tp1.db'}"]
    done = subprocess.run(single, capture_output=True, text=True, timeout=timeout_s, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += [f"--log-dir={tmp_path / 'logs'}", "--redirects=3", "-m", "snapeval", *overrides]
    command.append(f"run.db={tmp_path / 'tp2.db'}")
    split = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=environment)
    assert split.returncode == 0, split.stderr[-3000:]
    printed = {log.parent.name: log.read_text() for log in (tmp_path / "logs").rglob("stdout.log")}
    stored = {}
    for name in ("tp1", "tp2"):
        with sqlite3.connect(tmp_path / f"{name}.db") as db:
            stored[name] = (
                db.execute(f"SELECT {SAMPLE_COLUMNS} FROM samples ORDER BY sample_id").fetchall(),
                db.execute("SELECT status, tensor_parallel FROM runs").fetchall(),
                db.execute("SELECT kv_bytes, kv_bytes_per_rank FROM samples ORDER BY sample_id").fetchall(),
            )
    return stored, printed


def assert_same_samples(stored: dict) -> None:
    """The TP=2 run of :func:`stored_runs` stored the TP=1 run's samples, and each run its TP degree."""
    assert len(stored["tp1"][0]) == 2
    for tp2_row, tp1_row in zip(stored["tp2"][0], stored["tp1"][0], strict=True):
        for name, tp2_value, tp1_value in zip(SAMPLE_COLUMNS.split(", "), tp2_row, tp1_row, strict=True):
            if name != "extra":
                assert tp2_value == tp1_value, f"{name}: {tp2_value} != {tp1_value}"
        tp2_extra, tp1_extra = json.loads(tp2_row[-1]), json.loads(tp1_row[-1])  # the kept histogram: a
        tp2_counts, tp1_counts = tp2_extra.pop("kept_histogram"), tp1_extra.pop("kept_histogram")  # mean
        assert tp2_extra == tp1_extra and tp2_counts["bins"] == tp1_counts["bins"]  # over ranks' heads
        assert tp2_counts["counts"] == pytest.approx(tp1_counts["counts"], abs=1e-6)
    assert stored["tp1"][1] == [("finished", 1)] and stored["tp2"][1] == [("finished", 2)]


@pytest.mark.slow  # .ci/run runs it
def test_a_rank_killed_mid_run_ends_the_other_in_one_line_with_every_stored_sample_whole(
    tiny_llama_overrides, tmp_path
):
    """Rank 1 of a TP=2 run killed (SIGKILL) once rank 0 has stored a sample: rank 0 ends in one line (a
    lost peer, or torchrun's SIGTERM: interrupted), never a traceback; its run is closed, and every
    stored sample is whole."""
    import signal
    import time

    import psutil

    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    db = tmp_path / "tp2.db"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += [f"--log-dir={tmp_path / 'logs'}", "--redirects=3", "-m", "snapeval", *tiny_llama_overrides]
    command += [*RUN[1:], "run.limit=12", "task.max_new_tokens=48", "run.batch_size=1", f"run.db={db}"]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and launcher.poll() is None:
        try:
            with sqlite3.connect(db) as connection:
                if connection.execute("SELECT count(*) FROM samples").fetchone()[0]:
                    break
        except sqlite3.Error:
            pass
        time.sleep(0.2)
    ranks = {
        child.environ().get("RANK"): child
        for child in psutil.Process(launcher.pid).children(recursive=True)
        if "snapeval" in " ".join(child.cmdline())
    }
    ranks["1"].send_signal(signal.SIGKILL)
    launcher.communicate(timeout=TIMEOUT_S)
    rank0 = next((tmp_path / "logs").rglob("0/stderr.log")).read_text()
    lines = [line for line in rank0.splitlines() if line.startswith(("error:", "interrupted:"))]
    assert len(lines) == 1 and "Traceback" not in rank0, rank0[-3000:]
    assert "rank 0 of 2" in lines[0] or lines[0].startswith("interrupted:"), lines
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT status FROM runs").fetchone()[0] in ("failed", "interrupted")
        rows = connection.execute("SELECT output, score, generated_tokens FROM samples").fetchall()
    assert 1 <= len(rows) < 12 and all(None not in row for row in rows)


def test_another_rank_scores_nothing_and_keeps_the_output_its_waits_follow():
    """Under torchrun rank 0 alone scores a sample (LiveCodeBench's sandbox runs once) and stores it; another
    rank hands the mirrored database the output alone, and still records the full cache's output, which
    orders what the compressed settings wait for."""
    from types import SimpleNamespace

    from snapeval.configs.setting import CacheSetting
    from snapeval.decode.continuous import Answer, Request
    from snapeval.run.evaluation import Evaluation
    from snapeval.run.points import Point
    from snapeval.tasks import Prompt

    scored, committed = [], []
    evaluation = Evaluation.__new__(Evaluation)
    full = Point({"cache": {"method": "full"}}, CacheSetting.of({"method": "full"}), "digest", 1, {"p"})
    evaluation.full, evaluation.reference, evaluation.awaiting = full, {}, {}
    evaluation.task = SimpleNamespace(score=lambda prompt, output: scored.append(output) or {"score": 1.0})
    evaluation.tokenizer = SimpleNamespace(
        decode=lambda tokens, skip_special_tokens: " ".join(map(str, tokens))
    )
    evaluation.db = SimpleNamespace(add_sample=lambda run_id, digest, row: committed.append(row) or False)
    evaluation.progress = SimpleNamespace(update=lambda: None)
    evaluation.writes = False
    answer = Answer(Request((1, 2), {"method": "full"}, 3), [7, 8], "eos", 0.1, 0.2, 64, 0, None)
    evaluation.store(full, Prompt("p", [{"role": "user", "content": "x"}], "7"), (answer,))
    assert scored == [] and committed == [{"sample_id": "p", "output": "7 8"}]
    assert evaluation.reference == {"p": "7 8"}
