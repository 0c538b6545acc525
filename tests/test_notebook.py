"""notebooks/explore_results.ipynb runs headless against a small hand-made database."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

from snapeval.results import ResultsDB, config_hash

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "explore_results.ipynb"


def write_results(path: Path) -> None:
    """The full cache and SnapKV at two budgets on one task, 10 samples each."""
    settings = [
        ({"method": "full"}, 9),
        ({"method": "snapkv", "budget": 64}, 5),
        ({"method": "snapkv", "budget": 128}, 8),
    ]
    with ResultsDB(path) as db:
        for cache, correct in settings:
            config = {"model": {"name": "smollm2-135m"}, "task": {"name": "ruler_passkey"}, "cache": cache}
            digest = config_hash(config)
            run_id = db.start_run(config, digest)
            for index in range(10):
                row = {
                    "sample_id": index,
                    "score": float(index < correct),
                    "kv_bytes": 2**20,
                    "decode_s": 0.1,
                }
                db.add_sample(run_id, digest, {**row, "generated_tokens": 4})
            db.finish_run(run_id)


def test_notebook_summarizes_and_draws_the_database(tmp_path, monkeypatch):
    write_results(tmp_path / "results.sqlite")
    monkeypatch.setenv("SNAPEVAL_DB", str(tmp_path / "results.sqlite"))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=120, resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    printed = "".join(output.get("text", "") for output in outputs)
    assert "30 samples of 3 runs" in printed
    assert sum("image/png" in output.get("data", {}) for output in outputs) == 2
    figures = tmp_path / "results" / "figures"
    assert {path.name for path in figures.iterdir()} >= {"accuracy_vs_budget.png", "accuracy_vs_memory.png"}
