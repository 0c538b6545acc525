"""Paper figures from a small hand-made results database: no model is loaded."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from snapeval.configs.methods import METHODS, method_label
from snapeval.figures import (
    FIGURES,
    NothingToDraw,
    accuracy_vs_budget,
    accuracy_vs_memory,
    budget,
    decode_evictions,
    evictions,
    kept,
    kept_positions,
    kept_series,
    memory,
    pareto_front,
    traces,
    window_kernel_heatmap,
)
from snapeval.figures.command import main
from snapeval.figures.panels import PANEL_SIZE
from snapeval.figures.style import METHOD_COLORS, OKABE_ITO, SPARE_COLORS, method_color
from snapeval.report import build_report
from snapeval.report.document import Figure
from snapeval.results import ResultsDB, config_hash, database_url

N = 16
BYTES_PER_SLOT = 30 * 3 * 2 * 64 * 4  # layers x KV heads x (K, V) x head dim x fp32


def store(
    db: ResultsDB,
    task: str,
    cache: dict,
    accuracy: float,
    rng: np.random.Generator,
    kept: list[float] | None = None,
    slots: int | None = None,
    decoding: Callable[[int], dict] | None = None,
) -> None:
    """N samples of one setting, each right with probability ``accuracy``, with a kept histogram if given,
    rows of ``slots`` (default: the budget, else 512), and ``decoding(trace length)`` added to each trace."""
    config = {
        "model": {"name": "smollm2-135m"},
        "task": {"name": task, "context_length": 512},
        "cache": cache,
    }
    digest = config_hash(config)
    run_id = db.start_run(config, digest)
    slots = slots or cache.get("budget", 512)
    for index in range(N):
        extra = {"kept_histogram": {"bins": np.linspace(0, 1, 11).tolist(), "counts": kept}} if kept else {}
        length = int(600 - slots + 40 * index)  # smaller budgets, longer traces; 512 new tokens at most
        extra["trace"] = {"generated_tokens": min(length, 512), "truncated": length >= 512}
        if decoding is not None:
            extra["trace"] |= decoding(extra["trace"]["generated_tokens"])
        row = {"sample_id": f"{task}-{index}", "score": float(rng.random() < accuracy), "extra": extra}
        db.add_sample(run_id, digest, {**row, "kv_bytes": slots * BYTES_PER_SLOT, "decode_s": 0.1})
    db.finish_run(run_id)


def snapkv(budget: int, window: int = 32, kernel: int = 7) -> dict:
    return {"method": "snapkv", "budget": budget, "window": window, "kernel": kernel, "pooling": "max"}


def snapstream(budget: int, reselect_every: int | None = None) -> dict:
    cache = {**snapkv(budget), "method": "snapstream", "sinks": 4, "ring": 64}
    return cache | ({"reselect_every": reselect_every} if reselect_every else {})


def rkv(budget: int) -> dict:
    return {"method": "rkv", "budget": budget, "buffer": 64, "window": 8, "kernel": 7, "mix_lambda": 0.1}


def kvpress_decoding(budget: int) -> dict:
    press = {"press": "KnormPress", "press_args": "{}", "decoding": True, "hidden_states_buffer_size": 256}
    return {"method": "kvpress", "budget": budget, "compression_interval": 64, **press}


def reselected(first: int, every: int, generated_held: int, prompt_share: float) -> Callable[[int], dict]:
    """A trace's decode-time fields for a row re-selected at step ``first`` and every ``every`` steps after
    (none: ``first`` past the trace), holding ``generated_held`` generated tokens at the end."""

    def decoding(length: int) -> dict:
        steps = list(range(first, length + 1, every))
        return {
            "evictions": steps,
            "eviction_count": len(steps),
            "first_eviction_step": steps[0] if steps else None,
            "kept_prompt_share": prompt_share,
            "kept_generated_share": min(1.0, generated_held / length),
        }

    return decoding


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    """Two tasks: full cache, SnapKV and SnapStream at three budgets, a SnapKV window x kernel grid."""
    rng = np.random.default_rng(0)
    kept = [1.0, 0.4, 0.2, 0.2, 0.3, 0.2, 0.2, 0.3, 0.5, 1.0]
    with ResultsDB(tmp_path_factory.mktemp("db") / "results.sqlite") as db:
        for task in ("ruler_passkey", "ruler_niah_single"):
            store(db, task, {"method": "full"}, 0.95, rng)
            for budget in (128, 256, 384):
                store(db, task, snapkv(budget), budget / 420, rng)
                store(db, task, snapstream(budget), budget / 400, rng, kept=kept)
                decoding = reselected(64, 64, budget // 2, 0.3)
                store(db, task, rkv(budget), budget / 450, rng, slots=budget + 64, decoding=decoding)
            for window in (8, 16, 32):
                for kernel in (5, 7) if window != 32 else (5,):  # (32, 7) is in the budget sweep
                    store(db, task, snapkv(256, window, kernel), 0.3 + window / 64 - kernel / 50, rng)
        return db.dataframe()


def test_summaries_report_trace_length_and_truncation(samples):
    from snapeval.results import summarize

    table = summarize(samples[samples["task"] == "ruler_passkey"], ["cache.method", "cache.budget"])
    full = table[table["cache.method"] == "full"].iloc[0]
    lengths = [min(600 - 512 + 40 * i, 512) for i in range(N)]  # the full cache's 512 slots
    assert full["trace_tokens"] == pytest.approx(sum(lengths) / N)
    assert full["truncated"] == pytest.approx(sum(600 - 512 + 40 * i >= 512 for i in range(N)) / N)
    snap = table[(table["cache.method"] == "snapstream") & (table["cache.budget"] == 128)].iloc[0]
    assert snap["trace_tokens"] > full["trace_tokens"] and snap["truncated"] > full["truncated"]


# accuracy_per_turn needs multi-turn samples, which these are not: tests/test_turn_figure.py writes it
@pytest.mark.parametrize("name", [name for name in FIGURES if name != "accuracy_per_turn"])
def test_each_figure_is_written_as_pdf_and_png(name, samples, tmp_path):
    pdf, png = FIGURES[name](samples, tmp_path / "figures")
    assert (pdf.name, png.name) == (f"{name}.pdf", f"{name}.png")
    assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 5_000
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 10_000


def test_figures_without_their_data_say_what_is_missing(samples, tmp_path):
    budget_sweep = samples[samples["cache.window"].isna() | (samples["cache.kernel"] == 7)]
    with pytest.raises(NothingToDraw, match="two or more windows"):
        window_kernel_heatmap(budget_sweep, tmp_path)
    with pytest.raises(NothingToDraw, match="kept_histogram"):
        kept_positions(samples[samples["cache.method"] != "snapstream"], tmp_path)
    with pytest.raises(NothingToDraw, match="budget"):
        accuracy_vs_budget(samples[samples["cache.method"] == "full"], tmp_path)
    with pytest.raises(NothingToDraw, match="no samples"):
        accuracy_vs_memory(samples.iloc[:0], tmp_path)
    assert not list(tmp_path.iterdir())


def test_pareto_front_keeps_the_points_nothing_beats():
    memory = [1.0, 2.0, 2.0, 3.0, 4.0, 5.0]
    accuracy = [0.5, 0.7, 0.6, 0.7, 0.9, 0.8]
    assert pareto_front(memory, accuracy).tolist() == [True, True, False, False, True, False]


def test_cli_writes_every_figure_it_has_data_for(tmp_path, capsys):
    with ResultsDB(tmp_path / "results.sqlite") as db:
        rng = np.random.default_rng(1)
        store(db, "ruler_passkey", {"method": "full"}, 0.9, rng)
        store(db, "ruler_passkey", snapkv(128), 0.6, rng)
        store(db, "ruler_passkey", snapkv(256), 0.8, rng)
    assert main(["--db", str(tmp_path / "results.sqlite"), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "wrote accuracy_vs_budget" in printed and "wrote accuracy_vs_memory" in printed
    assert "skipped window_kernel_heatmap: no setting was run at two or more windows" in printed
    assert "skipped kept_positions: no sample records" in printed
    assert "skipped decode_evictions: no sample records a re-selection" in printed
    assert "skipped accuracy_per_turn: no sample asks several questions" in printed
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [
        f"{name}.{extension}"
        for name in ("accuracy_vs_budget", "accuracy_vs_memory", "traces_vs_budget")
        for extension in ("pdf", "png")
    ]


def test_cli_without_a_database_fails_in_one_line(tmp_path, capsys):
    assert main(["--db", str(tmp_path / "missing.sqlite"), "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: --db: no results database at") and captured.err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_kept_positions_average_the_settings_of_a_budget_and_keep_their_spread():
    def sample(budget, window, counts):
        histogram = {"bins": [0.0, 0.5, 1.0], "counts": counts}
        return {
            "cache.method": "snapstream",
            "cache.budget": budget,
            "cache.window": window,
            "kept_histogram": histogram,
        }

    rows = pd.DataFrame(
        [
            sample(256, 8, [1.0, 0.2]),
            sample(256, 8, [0.8, 0.4]),
            sample(256, 16, [0.4, 0.6]),
            sample(384, 8, [1, 1]),
        ]
    )
    small, large = kept_series(rows, ["cache.method", "cache.budget", "cache.window"])
    assert (small.label, small.settings, large.label, large.settings) == (
        "SnapStream 256",
        2,
        "SnapStream 384",
        1,
    )
    np.testing.assert_allclose(small.mean, [0.65, 0.45])  # window 8: [0.9, 0.3] (two samples); 16: [0.4, 0.6]
    np.testing.assert_allclose(small.low, [0.4, 0.3])
    np.testing.assert_allclose(small.high, [0.9, 0.6])


#: Each figure with a legend, drawn without saving.
DRAW = {
    "accuracy_vs_budget": budget.draw,
    "accuracy_vs_memory": memory.draw,
    "kept_positions": kept.draw,
    "traces_vs_budget": traces.draw,
    "decode_evictions": evictions.draw,
}


@pytest.fixture(scope="module")
def coinciding(tmp_path_factory):
    """One task: the full cache, and SnapKV and SnapStream with the same scores and traces at 3 budgets."""
    with ResultsDB(tmp_path_factory.mktemp("db") / "results.sqlite") as db:
        store(db, "ruler_passkey", {"method": "full"}, 0.9, np.random.default_rng(0))
        for cache in (snapkv, snapstream):
            rng = np.random.default_rng(1)  # the same draws: the same scores
            for budget in (128, 256, 512):
                store(db, "ruler_passkey", cache(budget), budget / 600, rng)
        return db.dataframe()


@pytest.mark.parametrize("name", ["accuracy_vs_budget", "traces_vs_budget"])
def test_coinciding_series_are_drawn_apart(name, coinciding):
    fig = DRAW[name](coinciding)
    fig.draw_without_rendering()
    for ax in fig.axes:
        lines = {line.get_label(): line for line in ax.get_lines()}
        snap_kv, snap_stream = lines["SnapKV"], lines["SnapStream"]
        np.testing.assert_array_equal(snap_kv.get_ydata(), snap_stream.get_ydata())  # they coincide
        assert snap_kv.get_marker() != snap_stream.get_marker()
        # get_linestyle() says "--" for every dash pattern; the pattern drawn is (offset, on-off lengths)
        assert snap_kv._unscaled_dash_pattern != snap_stream._unscaled_dash_pattern
        ticks = ax.get_xticks().tolist()
        assert ticks == [128, 256, 512]
        for line in (snap_kv, snap_stream):  # each point beside its budget's tick, nearer it than the next
            x = np.asarray(line.get_xdata(), dtype=float)
            assert np.all(np.abs(np.log2(x / ticks)) < 0.25) and not np.allclose(x, ticks)
        points = [ax.transData.transform(np.column_stack(line.get_data())) for line in (snap_kv, snap_stream)]
        apart = np.linalg.norm(points[0] - points[1], axis=1)
        marker = snap_kv.get_markersize() * fig.dpi / 72  # pixels
        assert np.all(apart >= marker), f"points {apart} px apart, markers {marker:.1f} px wide"


@pytest.mark.parametrize("name", DRAW)
@pytest.mark.parametrize("tasks", [["ruler_passkey"], ["ruler_passkey", "ruler_niah_single"]])
def test_the_legend_fits_the_figure_below_the_panels(name, tasks, samples):
    fig = DRAW[name](samples[samples["task"].isin(tasks)])
    fig.draw_without_rendering()
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent()), f"the legend covers panel {ax.get_title()!r}"
        assert not box.overlaps(ax.get_tightbbox()), f"the legend covers the labels of {ax.get_title()!r}"
        assert box.y1 < ax.get_tightbbox().y0  # below


def test_a_legend_wider_than_one_panel_wraps_and_the_panel_keeps_its_size(samples, tmp_path):
    one_task = samples[samples["task"] == "ruler_passkey"]
    _, png = accuracy_vs_memory(one_task, tmp_path)  # five entries: more than one row fits one panel
    width, height = (int.from_bytes(png.read_bytes()[offset : offset + 4], "big") for offset in (16, 20))
    dpi, pad = 300, 2 * 0.02 * 300
    assert PANEL_SIZE[0] * dpi * 0.9 <= width <= PANEL_SIZE[0] * dpi + pad
    assert height > PANEL_SIZE[1] * dpi  # the legend's rows are added below the panel


@pytest.fixture(scope="module")
def reasoning(tmp_path_factory):
    """An AIME-like sweep: the full cache, SnapKV (no re-selection), SnapStream with and without
    re-selection, R-KV and a kvpress decoding press (rows of budget + 64 slots), at budgets 128 and 256."""
    rng = np.random.default_rng(2)
    with ResultsDB(tmp_path_factory.mktemp("db") / "results.sqlite") as db:
        store(db, "aime24", {"method": "full"}, 0.6, rng)
        for size in (128, 256):
            store(db, "aime24", snapkv(size), 0.3, rng)
            store(db, "aime24", snapstream(size), 0.3, rng, decoding=reselected(10**6, 1, 64, size / 600))
            store(db, "aime24", snapstream(size, 16), 0.3, rng, decoding=reselected(64, 16, 64, size / 600))
            store(
                db,
                "aime24",
                rkv(size),
                0.4,
                rng,
                slots=size + 64,
                decoding=reselected(64, 64, size // 2, 0.3),
            )
            decoding = reselected(64, 64, size // 4, 0.2)
            store(db, "aime24", kvpress_decoding(size), 0.4, rng, slots=size + 64, decoding=decoding)
        return db.dataframe()


def lengths(size: int) -> list[int]:
    """The trace lengths :func:`store` gives the samples of rows of ``size`` slots."""
    return [min(600 - size + 40 * index, 512) for index in range(N)]


def test_decode_evictions_draws_accuracy_at_the_memory_each_row_holds(reasoning):
    accuracy_ax, _, _ = evictions.draw(reasoning).axes
    lines = {bars.get_label(): bars.lines[0] for bars in accuracy_ax.containers}  # each series' error bars
    mib = BYTES_PER_SLOT / 2**20
    drawn = {label: np.asarray(line.get_xdata(), dtype=float) / mib for label, line in lines.items()}
    assert set(drawn) == {
        "Full cache",
        "SnapKV",
        "SnapStream",
        "SnapStream, reselect_every=16",
        "R-KV",
        "kvpress",
    }
    np.testing.assert_allclose(drawn["R-KV"], [128 + 64, 256 + 64])  # budget + buffer
    np.testing.assert_allclose(drawn["kvpress"], [128 + 64, 256 + 64])  # budget + compression_interval
    np.testing.assert_allclose(drawn["SnapStream, reselect_every=16"], [128, 256])
    np.testing.assert_allclose(drawn["Full cache"], [512])
    variants = lines["SnapStream"], lines["SnapStream, reselect_every=16"]
    assert variants[0].get_color() == variants[1].get_color()
    assert variants[0]._unscaled_dash_pattern != variants[1]._unscaled_dash_pattern


def test_decode_evictions_draws_the_kept_shares_of_prompt_and_generated_tokens(reasoning):
    _, kept_ax, _ = evictions.draw(reasoning).axes
    lines = {line.get_label(): line for line in kept_ax.get_lines()}
    assert "Full cache" not in lines  # it keeps everything: no shares stored
    rkv_line = lines["R-KV"]
    np.testing.assert_allclose(rkv_line.get_xdata(), [0.3, 0.3])
    held = [np.mean([min(1.0, size // 2 / length) for length in lengths(size + 64)]) for size in (128, 256)]
    np.testing.assert_allclose(rkv_line.get_ydata(), held)
    np.testing.assert_allclose(lines["SnapStream"].get_xdata(), [128 / 600, 256 / 600])
    assert sorted(text.get_text() for text in kept_ax.texts).count("128") == 4  # each series' budgets written


def test_decode_evictions_marks_the_steps_of_each_re_selection(reasoning):
    _, _, steps_ax = evictions.draw(reasoning).axes
    labels = [text.get_text() for text in steps_ax.texts]
    expected = {
        f"R-KV {size}": np.mean([len(range(64, length + 1, 64)) for length in lengths(size + 64)])
        for size in (128, 256)
    } | {
        f"SnapStream {size}, reselect_every=16": np.mean([len(range(64, n + 1, 16)) for n in lengths(size)])
        for size in (128, 256)
    }
    for name, per_sample in expected.items():
        assert f"{name}: {per_sample:.1f} per sample" in labels
    assert not any(
        label.startswith(("SnapKV", "SnapStream 128:", "Full")) for label in labels
    )  # none evicted
    assert len(labels) == 6  # kvpress, R-KV and re-selecting SnapStream at two budgets
    rows = {label.split(":")[0]: row for row, label in enumerate(labels)}
    events = steps_ax.collections[rows["R-KV 128"]].get_positions()
    longest = max(lengths(128 + 64))
    np.testing.assert_array_equal(sorted(events), list(range(64, longest + 1, 64)))


def test_decode_evictions_needs_a_re_selection(samples, reasoning, tmp_path):
    with pytest.raises(NothingToDraw, match="re-selection"):
        decode_evictions(samples[samples["cache.method"] != "rkv"], tmp_path)
    no_reselection = reasoning[~reasoning["cache.method"].isin(["rkv", "kvpress"])]
    no_reselection = no_reselection[no_reselection["cache.reselect_every"].isna()]
    with pytest.raises(NothingToDraw, match="re-selection"):
        decode_evictions(no_reselection, tmp_path)
    assert not list(tmp_path.iterdir())


def test_every_method_has_one_colour_blind_safe_colour_in_every_figure_and_the_report(tmp_path):
    """Each method of the registry has its own Okabe-Ito colour (the full cache black), and the paper
    figures and the report's charts draw it in that colour."""
    from tests.test_report import PASSKEY
    from tests.test_report import store as store_composed

    assert METHOD_COLORS.keys() == METHODS.keys()
    assert len(set(METHOD_COLORS.values())) == len(METHODS)
    assert set(METHOD_COLORS.values()) <= set(OKABE_ITO.values())
    assert not set(SPARE_COLORS) & set(METHOD_COLORS.values())
    assert METHOD_COLORS["snapstream"] != METHOD_COLORS["streaming_llm"]
    assert all(method_color(method) == colour for method, colour in METHOD_COLORS.items())

    url = database_url(tmp_path / "results.sqlite")
    with ResultsDB(url) as db:
        store_composed(db, [*PASSKEY, "cache=full"], [1.0, 0.0] * 5)
        for method in METHODS.keys() - {"full"}:
            store_composed(db, [*PASSKEY, f"cache={method}", "cache.budget=256"], [1.0, 0.0] * 5)
        samples = db.dataframe()
        [chart] = [block for block in build_report(db, (0.95,)).blocks if isinstance(block, Figure)]
    (legend,) = budget.draw(samples).legends
    drawn = {}
    for text, handle in zip(legend.texts, legend.legend_handles, strict=True):
        colour = handle.get_color()  # a line's, or the RGBA rows of an error bar's lines
        drawn[text.get_text()] = to_hex(colour if isinstance(colour, str) else colour[0])
    assert drawn == {method_label(method): colour.lower() for method, colour in METHOD_COLORS.items()}
    svg = chart.svg.decode()
    for method, colour in METHOD_COLORS.items():
        assert f"stroke: {colour.lower()}" in svg, f"the report draws {method} in {colour}"
