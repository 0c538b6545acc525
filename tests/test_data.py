"""Benchmark data: local files, $SNAPEVAL_DATA_DIR, and bad data stopping at the file and line."""

from __future__ import annotations

import json

import pytest

from snapeval.errors import SnapevalError
from snapeval.tasks.aime24 import AIME24
from snapeval.tasks.livecodebench import LIVECODEBENCH
from snapeval.tasks.longbench_v2 import LONGBENCH_V2
from snapeval.tasks.rows import load_rows

from .paths import SHARED_DATA, needs_shared_data


@needs_shared_data
def test_shared_data_loads_through_the_environment_variable(monkeypatch):
    monkeypatch.setenv("SNAPEVAL_DATA_DIR", str(SHARED_DATA))
    assert len(load_rows(AIME24)) == 30
    assert len(load_rows(LONGBENCH_V2)) == 150
    assert len(load_rows(LIVECODEBENCH)) == 239


def test_an_explicit_file_or_folder_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("SNAPEVAL_DATA_DIR", "/nonexistent")
    folder = tmp_path / "aime"
    folder.mkdir()
    (folder / "mine.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    assert load_rows(AIME24, str(folder)) == [{"problem": "1+1?", "answer": "2"}]


def test_corrupt_json_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"problem": "a", "answer": "1"}) + "\n" + '{"problem": "b", "answer": \n')
    with pytest.raises(SnapevalError, match=r"bad\.jsonl, line 2: invalid JSON"):
        load_rows(AIME24, str(path))


def test_missing_field_names_the_file_row_and_field(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"problem": "a", "answer": "1"}) + "\n" + json.dumps({"problem": "b"}) + "\n")
    with pytest.raises(SnapevalError, match=r"rows\.jsonl, row 2: missing field\(s\) answer"):
        load_rows(AIME24, str(path))


def test_missing_data_dir_entry_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SNAPEVAL_DATA_DIR", str(tmp_path))
    with pytest.raises(SnapevalError, match="SNAPEVAL_DATA_DIR is set but"):
        load_rows(AIME24)
