"""The figure ``accuracy_per_turn`` from a small hand-made database of multi-turn samples: no model loads."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_rgb

from snapeval.figures import NothingToDraw, accuracy_per_turn
from snapeval.figures.command import main
from snapeval.figures.turns import draw
from snapeval.results import ResultsDB, config_hash
from snapeval.stats import mean_ci

#: Per setting (compression, method, budget), each sample's answers to its three turns (1: right). SnapKV
#: query-aware finds every first needle and loses the later ones at 128; one sample of SnapKV 256 asked
#: two turns only.
TURNS: dict[tuple[str | None, str, int | None], list[tuple[int, ...]]] = {
    (None, "full", None): [(1, 1, 1), (1, 1, 0), (1, 1, 1), (1, 0, 1), (1, 1, 1)],
    (None, "snapkv", 128): [(1, 0, 0), (1, 1, 0), (1, 0, 0), (1, 0, 1), (1, 0, 0)],
    (None, "snapkv", 256): [(1, 1, 0), (1, 1, 1), (1, 0, 1), (1, 1), (1, 0, 1)],
    (None, "snapstream", 128): [(1, 1, 0), (0, 1, 0), (1, 0, 0), (1, 0, 1), (1, 1, 0)],
    (None, "snapstream", 256): [(1, 1, 1), (1, 1, 0), (1, 1, 1), (0, 1, 1), (1, 1, 0)],
    ("query_agnostic", "full", None): [(1, 1, 1), (1, 1, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1)],
    ("query_agnostic", "snapkv", 128): [(0, 1, 0), (1, 0, 0), (0, 0, 1), (1, 1, 0), (0, 0, 0)],
    ("query_agnostic", "snapkv", 256): [(1, 1, 0), (0, 1, 1), (1, 0, 1), (1, 1, 1), (0, 0, 1)],
}
METHODS = {"full": "Full cache", "snapkv": "SnapKV", "snapstream": "SnapStream"}


def store(db: ResultsDB, task: dict, cache: dict, turns: list[tuple[int, ...]]) -> None:
    """One sample per row of ``turns``, as the runner stores it: ``turn_k`` per turn (none for a one-turn
    sample) and their mean as ``score``."""
    config = {"model": {"name": "smollm2-135m"}, "task": task, "cache": cache}
    digest = config_hash(config)
    run_id = db.start_run(config, digest)
    for index, scores in enumerate(turns):
        score = sum(scores) / len(scores)
        per_turn = {f"turn_{k}": float(s) for k, s in enumerate(scores, start=1)} if len(scores) > 1 else {}
        metrics = {"score": score, **per_turn}
        db.add_sample(run_id, digest, {"sample_id": str(index), "score": score, "metrics": metrics})
    db.finish_run(run_id)


def cache_of(method: str, budget: int | None) -> dict:
    return {"method": method} | ({"budget": budget, "window": 32, "kernel": 7} if budget else {})


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    """The settings of :data:`TURNS` on a three-turn task, beside a one-turn task's full cache and SnapKV."""
    path = tmp_path_factory.mktemp("db") / "results.sqlite"
    with ResultsDB(path) as db:
        for (compression, method, budget), turns in TURNS.items():
            task = {"name": "ruler_niah_multiturn", "context_length": 512, "turns": 3}
            store(
                db,
                task | ({"compression": compression} if compression else {}),
                cache_of(method, budget),
                turns,
            )
        for method, budget in (("full", None), ("snapkv", 128)):
            store(
                db,
                {"name": "ruler_niah_single", "context_length": 512},
                cache_of(method, budget),
                [(1,), (0,)],
            )
    return path


def expected(compression: str | None, method: str, budget: int | None, turn: int) -> tuple[float, ...]:
    """The accuracy of ``turn`` over the setting's samples that asked it, and its interval."""
    return mean_ci([sample[turn - 1] for sample in TURNS[compression, method, budget] if len(sample) >= turn])


def test_each_panel_draws_the_accuracy_of_its_turn_per_method_and_compression(database):
    with ResultsDB(database) as db:
        fig = draw(db.dataframe())
    panels = [ax for ax in fig.axes if ax.get_visible()]
    titles = [ax.get_title() for ax in panels]
    modes = ("query_aware", "query_agnostic")
    assert titles == [f"ruler_niah_multiturn, {mode}\nturn {turn}" for mode in modes for turn in (1, 2, 3)]
    for ax, title in zip(panels, titles, strict=True):
        compression = None if "query_aware" in title else "query_agnostic"
        turn = int(title[-1])
        lines = {line.get_label(): line for line in ax.get_lines()}
        methods = {method for mode, method, _ in TURNS if mode == compression}
        assert lines.keys() == {METHODS[method] for method in methods}
        full = lines.pop("Full cache")
        assert full.get_ydata() == [expected(compression, "full", None, turn)[0]] * 2  # across the panel
        assert full.get_linestyle() == "--"
        for label, line in lines.items():
            method = next(method for method, name in METHODS.items() if name == label)
            drawn = [expected(compression, method, budget, turn) for budget in (128, 256)]
            np.testing.assert_allclose(line.get_ydata(), [mean for mean, _, _ in drawn])
            assert np.all(np.abs(np.log2(np.asarray(line.get_xdata()) / [128, 256])) < 0.25)
            [band] = [
                c for c in ax.collections if np.allclose(c.get_facecolor()[0][:3], to_rgb(line.get_color()))
            ]
            low, high = band.get_paths()[0].vertices[:, 1].min(), band.get_paths()[0].vertices[:, 1].max()
            assert (low, high) == pytest.approx((min(d[1] for d in drawn), max(d[2] for d in drawn)))
    aware = [{line.get_label(): line.get_ydata() for line in ax.get_lines()} for ax in panels[:3]]
    assert list(aware[0]["SnapKV"]) == [1.0, 1.0] == aware[0]["Full cache"]  # lossless at turn 1
    assert list(aware[1]["SnapKV"]) == pytest.approx([0.2, 0.6])  # then not
    assert list(aware[2]["SnapKV"]) == pytest.approx([0.2, 0.75])  # four samples of 256 asked turn 3


def test_the_figure_is_written_for_multi_turn_samples_and_skipped_without(database, tmp_path, capsys):
    assert main(["--db", str(database), "--out", str(tmp_path / "out")]) == 0
    assert "wrote accuracy_per_turn" in capsys.readouterr().out
    pdf, png = tmp_path / "out" / "accuracy_per_turn.pdf", tmp_path / "out" / "accuracy_per_turn.png"
    assert pdf.read_bytes().startswith(b"%PDF") and png.read_bytes().startswith(b"\x89PNG")

    with ResultsDB(database) as db:
        samples = db.dataframe()
    one_turn = samples[samples["task.name"] == "ruler_niah_single"]
    with pytest.raises(NothingToDraw, match=r"no sample asks several questions \(metric.turn_1\)"):
        accuracy_per_turn(
            one_turn.drop(columns=[c for c in samples if c.startswith("metric.turn_")]), tmp_path
        )
    with pytest.raises(NothingToDraw, match="several questions"):
        accuracy_per_turn(one_turn, tmp_path)  # the column is there, empty for one-turn samples
    with pytest.raises(NothingToDraw, match="no compressed multi-turn run has a budget"):
        accuracy_per_turn(samples[samples["cache.method"] == "full"], tmp_path)
    assert not list(tmp_path.glob("*.p*"))

    one_turn_db = tmp_path / "one_turn.sqlite"
    with ResultsDB(one_turn_db) as db:
        store(db, {"name": "ruler_niah_single", "context_length": 512}, cache_of("snapkv", 128), [(1,), (0,)])
    assert main(["--db", str(one_turn_db), "--out", str(tmp_path / "none")]) == 0
    assert "skipped accuracy_per_turn: no sample asks several questions" in capsys.readouterr().out
    assert not list((tmp_path / "none").glob("accuracy_per_turn.*"))
