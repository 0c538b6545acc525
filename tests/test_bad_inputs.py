"""Hostile inputs end in one line naming the field or the cause, before any model loads.

Each case of the hostile probe is run in-process through the front door's checks
(:func:`snapeval.__main__.check_before_hydra`, which ``python -m snapeval`` runs before Hydra starts) or
the reading commands' ``main``; two run as real commands, to show the exit code 2 and the single line.
No test here loads model weights.
"""

from __future__ import annotations

import importlib.util
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from snapeval.__main__ import check_before_hydra
from snapeval.cache.slots import CachedShapes, SlotCache
from snapeval.configs.compose import compose_config
from snapeval.decode import batch_rows
from snapeval.decode.sampling import Sampling, sample_one
from snapeval.errors import SnapevalError
from snapeval.figures.command import main as figures_main
from snapeval.results import ResultsDB
from snapeval.results.__main__ import main as results_main
from snapeval.results.schema import runs
from snapeval.run import evaluation, runner

HUGE = "9" * 100_000


def refusal(tmp_path: Path, *overrides: str) -> str:
    """The one-line error the front door gives for ``overrides`` (without ``error: ``)."""
    with pytest.raises(SnapevalError) as info:
        check_before_hydra([f"run.db={tmp_path / 'db.sqlite'}", *overrides])
    message = str(info.value)
    assert "\n" not in message
    return message


def data_file(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return f"task.metadata.data_path={path}"


def test_a_data_file_that_is_not_utf8_names_its_line(tmp_path):
    bad = data_file(tmp_path, "bad.jsonl", b'{"problem": "1+1", "answer": "2"}\n\xff\xfe{"problem": 1}\n')
    message = refusal(tmp_path, "task=aime24", bad)
    where = f"task.metadata.data_path: {tmp_path / 'bad.jsonl'}, line 2"
    assert message == f"{where}: not UTF-8 text (byte 0xff at offset 34)"


def test_a_text_file_named_parquet_is_not_a_parquet_file(tmp_path):
    fake = data_file(tmp_path, "rows.parquet", b"hello, not parquet\n")
    message = refusal(tmp_path, "task=aime24", fake)
    assert message.startswith(
        f"task.metadata.data_path: {tmp_path / 'rows.parquet'}: not a readable Parquet file"
    )


@pytest.mark.parametrize(
    "content,expected",
    [
        (b"", "holds no rows"),
        (b'{"problem": "x"\n', "line 1: invalid JSON"),
        (b'{"x": 1}\n', "missing field"),
    ],
)
def test_data_file_errors_come_before_the_model(tmp_path, content, expected):
    message = refusal(tmp_path, "task=aime24", data_file(tmp_path, "rows.jsonl", content))
    assert message.startswith("task.metadata.data_path: ") and expected in message


def test_a_number_too_long_for_hydras_parser(tmp_path):
    assert refusal(tmp_path, f"run.limit={HUGE}") == "run.limit: a number of 100000 digits is out of range"


def test_a_database_path_too_long_for_the_file_system(tmp_path):
    message = refusal(tmp_path, f"run.db={tmp_path / ('a' * 100_000)}")
    assert message.startswith("run.db: cannot use ") and message.endswith("characters): File name too long")
    assert len(message) < 300  # the path is shortened, not printed whole


@pytest.mark.parametrize(
    "override,expected",
    [
        ("seed=99999999999999999999999", "seed: must be an integer <= 9223372036854775807"),
        ("run.lease_s=99999999999999", "run.lease_s: must be an integer <= 1000000000"),
        ("run.limit=99999999999999999999", "run.limit: must be an integer <= 9223372036854775807"),
        ("run.batch_size=99999999999999999999", "run.batch_size: must be an integer <= "),
        (
            "task.max_new_tokens=100000",
            "task.max_new_tokens: 100000 new tokens leave no room for a prompt in the model's window "
            "of 8192 (model.max_context)",
        ),
    ],
)
def test_out_of_range_numbers(tmp_path, override, expected):
    assert refusal(tmp_path, override).startswith(expected)


def test_a_huge_ruler_limit_fails_at_once_instead_of_generating(tmp_path):
    message = refusal(tmp_path, "run.limit=1000000000000")
    assert message == (
        "run.limit: 1000000000000 samples would be generated before the first is evaluated; "
        "a generated task makes at most 100,000"
    )
    assert refusal(tmp_path, "task.num_prompts=100001").startswith("task.num_prompts: 100001 samples")


def test_a_sampling_seed_is_read_modulo_2_to_the_64():
    assert Sampling(seed=12345).seed == 12345 and Sampling(seed=2**63 - 1).seed == 2**63 - 1
    assert Sampling(seed=2**64 + 7).seed == 7
    logits = torch.linspace(0, 1, 50)
    sampled = Sampling(do_sample=True, seed=99999999999999999999999 * 1_000_003)
    assert sample_one(logits, sampled, 0) == sample_one(
        logits, Sampling(do_sample=True, seed=sampled.seed), 0
    )


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["cache=streaming_llm", "+cache.kernel=9"],
            "cache.kernel: unknown key; streaming_llm takes budget, kv_dtype, method, prefill_chunk, ratio, "
            "rerotate, sinks",
        ),
        (
            ["cache=snapstream", "+cache.press=Foo"],
            "cache.press: unknown key; snapstream takes budget, gqa_reduce",
        ),
    ],
)
def test_a_key_the_chosen_method_does_not_take(tmp_path, overrides, expected):
    assert refusal(tmp_path, *overrides).startswith(expected)


def test_a_grid_takes_parameters_of_any_of_its_methods(tmp_path):
    check_before_hydra(["+exp=smoke", "run.limit=1", f"run.db={tmp_path / 'db.sqlite'}"])  # no error


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["cache=snapstream", "cache.budget=2"], "cache.budget: must be an integer larger than"),
        (["cache=snapkv", "cache.kernel=4"], "cache.kernel: must be a positive odd integer"),
        (["+exp=smoke", "+grid.params.nope=1"], "grid.params.nope: no method of this grid"),
        (
            ["cache=speculative_prefill", "cache.draft=no-such-model"],
            "cache.draft: no model 'no-such-model': give self, a model config (",
        ),
        (["run.shard=5/8", "run.limit=2"], "run.shard: shard 5/8 of 2 sample(s) is empty"),
        (
            ["run.compile=graphs", "model.device=cpu"],
            "run.compile: CUDA graphs need a GPU, and this run has none",
        ),
        (
            ["+protocol=livecodebench_official", "task=ruler_passkey"],
            "protocol: livecodebench_official is a protocol of task livecodebench, not of task ruler_passkey",
        ),
        (["cache=kvpress", "cache.press_args='{bad'"], "cache.press_args: must be a JSON object such as"),
        (["cache=kvpress", "cache.press_args='[1, 2]'"], "cache.press_args: must be a JSON object such as"),
    ],
)
def test_errors_that_came_after_the_model_loaded_now_come_before(tmp_path, monkeypatch, overrides, expected):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("snapeval.models.load_model", no_model)
    monkeypatch.setattr("snapeval.models.load_tokenizer", no_model)
    assert refusal(tmp_path, *overrides).startswith(expected)


def test_an_unknown_press_is_named(tmp_path):
    message = refusal(tmp_path, "cache=kvpress", "cache.press=NoSuchPress")
    if importlib.util.find_spec("kvpress") is None:  # the press list is kvpress's: it says it lacks it
        assert message == "cache.method: kvpress is not installed; pip install 'snapeval[kvpress]'"
    else:
        assert message.startswith("cache.press: no kvpress scorer press 'NoSuchPress'; choose one of")


def test_rows_are_capped_by_the_requests_and_by_free_memory(monkeypatch):
    assert batch_rows.usable_rows(100_000, 10) == 10 and batch_rows.usable_rows(8, 10) == 8
    shapes = CachedShapes(3, 3, 16, 8, torch.float32, (None, 8, 8))  # a full layer, two with a window of 8
    slots = SlotCache(1, 40, *shapes[:5], torch.device("cpu"), windows=list(shapes.windows))  # one row
    valid = [rings.valid for rings in slots.rings.values()]
    tensors = [*slots.keys, *slots.values, *slots.positions, *valid]  # what row_bytes counts
    per_row = batch_rows.row_bytes(40, shapes)
    assert per_row == sum(t.numel() * t.element_size() for t in tensors)
    assert per_row < batch_rows.row_bytes(40, shapes._replace(windows=(None,) * 3))
    monkeypatch.setattr(batch_rows, "free_bytes", lambda device: 10 * per_row)
    batch_rows.check_rows_fit([(40, 10)], shapes, torch.device("cpu"))  # fits
    with pytest.raises(SnapevalError) as info:
        batch_rows.check_rows_fit([(40, 100_000)], shapes, torch.device("cpu"))
    assert str(info.value).startswith("run.batch_size: 100000 rows of 40 slots take ")
    assert str(info.value).endswith("GiB free: use at most 10")


def test_the_machines_free_memory_is_read():
    free = batch_rows.free_bytes(torch.device("cpu"))
    assert free is None or free > 0


def test_a_bad_context_length_fails_before_the_model(tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(evaluation, "load_model", no_model)
    cfg = compose_config("task.context_length=16", "run.limit=1", f"run.db={tmp_path / 'db.sqlite'}")
    with pytest.raises(SnapevalError) as info:
        runner.run(cfg)
    assert str(info.value).startswith("task.context_length: context_length 16 is too small")


def write_samples(path: Path) -> None:
    with ResultsDB(path) as db:
        run_id = db.start_run(
            {"model": {"name": "m"}, "task": {"name": "t"}, "cache": {"method": "full"}}, "h"
        )
        db.add_sample(run_id, "h", {"sample_id": "0", "output": "o", "score": 1.0})
        db.finish_run(run_id)


def test_export_to_a_folder_or_an_unwritable_path(tmp_path, capsys):
    write_samples(tmp_path / "db.sqlite")
    (tmp_path / "a_file").write_text("x")
    for target, expected in [
        (tmp_path, f"error: --csv: {tmp_path} is a directory; give a file name"),
        (tmp_path / "a_file" / "x.csv", f"error: --csv: cannot write {tmp_path / 'a_file' / 'x.csv'}: "),
    ]:
        code = results_main(["export", "--db", str(tmp_path / "db.sqlite"), "--csv", str(target)])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(expected) and err.count("\n") == 1, err


def test_figures_out_an_existing_file(tmp_path, capsys):
    write_samples(tmp_path / "db.sqlite")
    (tmp_path / "a_file").write_text("x")
    code = figures_main(["--db", str(tmp_path / "db.sqlite"), "--out", str(tmp_path / "a_file")])
    assert code == 2
    assert (
        capsys.readouterr().err
        == f"error: --out: {tmp_path / 'a_file'} is a file; give a folder for the figures\n"
    )


@pytest.mark.parametrize("command", [["summary"], ["export", "--csv", "out.csv"], "figures"])
def test_reading_commands_never_turn_a_file_into_a_database(tmp_path, capsys, command):
    empty, other = tmp_path / "empty.sqlite", tmp_path / "other.sqlite"
    empty.write_bytes(b"")
    with sqlite3.connect(other) as conn:  # a SQLite database of something else
        conn.execute("CREATE TABLE notes (text TEXT)")
    before = other.read_bytes()
    for path, expected in [(empty, "is not a SQLite database"), (other, "holds no snapeval results")]:
        if command == "figures":
            code = figures_main(["--db", str(path), "--out", str(tmp_path / "figures")])
        else:
            code = results_main([*command[:1], "--db", str(path), *command[1:]])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(f"error: --db: {path}") and expected in err, err
    assert empty.read_bytes() == b"" and other.read_bytes() == before


def test_a_later_run_of_a_point_closes_its_dead_runs_as_stale(tmp_path):
    config = {"model": {"name": "m"}, "task": {"name": "t"}, "cache": {"method": "full"}}
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    with ResultsDB(tmp_path / "db.sqlite") as db:
        killed, alive, other = db.start_run(config, "h"), db.start_run(config, "h"), db.start_run(config, "g")
        with db.engine.begin() as conn:
            for run_id in (killed, other):
                conn.execute(runs.update().where(runs.c.id == run_id).values(pid=int(ended.stdout)))
        later = db.start_run(config, "h")
        with db.engine.connect() as conn:
            stored = {row.id: row for row in conn.execute(runs.select())}
        states = {run["id"]: run["status"] for run in db.run_states()}
    assert stored[killed].status == "failed" and stored[killed].error.startswith("stale: its worker (")
    assert f"when run {later} of the same point started" in stored[killed].error
    assert [stored[run].status for run in (alive, other, later)] == ["running"] * 3  # alive, or another point
    assert [states[run] for run in (killed, alive, other)] == ["stale", "running", "stale"]


@pytest.mark.parametrize(
    "args,expected",
    [
        (
            ["-m", "snapeval", f"run.limit={HUGE}"],
            "error: run.limit: a number of 100000 digits is out of range\n",
        ),
        (
            ["-m", "snapeval.figures", "--db", "EMPTY"],
            "error: --db: EMPTY is not a SQLite database (left as it is)\n",
        ),
    ],
)
def test_as_commands_one_line_and_exit_code_2(tmp_path, args, expected):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    args = [str(empty) if arg == "EMPTY" else arg for arg in args]
    result = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert (result.returncode, result.stderr) == (2, expected.replace("EMPTY", str(empty)))
    assert empty.read_bytes() == b""


def test_press_args_are_read_as_json_whether_or_not_kvpress_is_installed():
    from snapeval.cache.kvpress import _press

    with pytest.raises(SnapevalError, match=r"^cache.press_args: must be a JSON object .* got '{bad'$"):
        _press("SnapKVPress", "{bad")
    with pytest.raises(SnapevalError, match=r"^cache.press_args: must be a JSON object"):
        _press("SnapKVPress", "[1, 2]")
