"""Output length and what it costs (issue 53 item 4): the growth of a method's mean generated tokens over
the full cache's on the same samples with its Fieller bounds (their coverage and the decision's false-pass
rate by simulation), tokens per correct answer, and the report's "Output length" section and
``--max-output-growth`` target on an AIME-style trace sweep whose numbers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import stdtrit

from snapeval.configs.compose import compose_config
from snapeval.report import build_report, render_markdown
from snapeval.report.__main__ import main
from snapeval.report.document import Mark, interval
from snapeval.results import ResultsDB, database_url, identity
from snapeval.stats.output_length import growth, jointly, tokens_per_correct
from snapeval.stats.simulation import growth_misses, growth_pass_rate, token_draws

from .test_report import row_of, tables

TRIALS = 400
ALLOWED = 0.05 + 3 * math.sqrt(0.05 * 0.95 / TRIALS)  # 5% plus three Monte-Carlo standard errors: 0.083

#: Twelve AIME-style problems: the full cache's trace lengths, SnapStream 256's (longer on every problem:
#: 19,400 tokens against 13,000, growth 1.4923), SnapStream 512's (the same total, growth 1), and
#: StreamingLLM 128's, which runs every trace to the cap and solves nothing.
FULL = [1000, 1200, 800, 1500, 900, 1100, 1300, 700, 1000, 1400, 1200, 900]
LONGER = [1600, 1700, 1300, 2100, 1400, 1600, 1900, 1100, 1500, 2000, 1800, 1400]
SAME = [1000, 1250, 800, 1450, 900, 1100, 1300, 750, 1000, 1400, 1150, 900]
CAP = [2048] * 12
SOLVED = [1.0] * 10 + [0.0] * 2  # the full cache, SnapStream 256 and 512 solve the first ten
TOKENS_PER_SECOND = 2000


def paired_t(method: list[float], full: list[float], g: float) -> float:
    """The paired t statistic of ``method - g * full``."""
    d = np.asarray(method, dtype=float) - g * np.asarray(full, dtype=float)
    return float(d.mean() / (d.std(ddof=1) / math.sqrt(d.size)))


def test_the_bounds_are_where_the_paired_t_statistic_reaches_its_quantile():
    bounds = growth(LONGER, FULL)
    quantile = float(stdtrit(len(FULL) - 1, 0.95))
    assert bounds.ratio == pytest.approx(19400 / 13000)
    assert (bounds.mean, bounds.full_mean, bounds.n) == (19400 / 12, 13000 / 12, 12)
    assert bounds.lower < bounds.ratio < bounds.upper
    assert paired_t(LONGER, FULL, bounds.upper) == pytest.approx(-quantile, abs=1e-9)
    assert paired_t(LONGER, FULL, bounds.lower) == pytest.approx(quantile, abs=1e-9)
    assert bounds.lower > 1.4  # longer on every problem: shown


def test_degenerate_pairs():
    exact = growth([150.0, 300.0, 450.0], [100.0, 200.0, 300.0])  # 1.5 times as long, on every sample
    assert (exact.lower, exact.upper) == pytest.approx((1.5, 1.5))
    assert exact.verdict(1.5) == "pass" and exact.verdict(1.49) == "fail"
    one = growth([10.0], [5.0])
    assert (one.ratio, one.lower, one.upper, one.verdict(10.0)) == (2.0, 0.0, math.inf, "too few")
    silent = growth([3.0, 4.0], [0.0, 0.0])  # the full cache wrote nothing: no ratio to bound
    assert math.isnan(silent.ratio) and (silent.lower, silent.upper) == (0.0, math.inf)
    assert silent.verdict(2.0) == "open"
    with pytest.raises(ValueError, match=">= 0"):
        growth([-1.0, 2.0], [1.0, 2.0])


def test_tokens_per_correct_answer():
    assert tokens_per_correct(LONGER, SOLVED) == 19400 / 10
    assert tokens_per_correct([10, 30], [0.5, 0.25]) == pytest.approx(40 / 0.75)
    assert math.isnan(tokens_per_correct(CAP, [0.0] * 12))


def test_both_targets_pass_only_together():
    assert jointly("pass", "pass") == "pass"
    assert jointly("pass", "fail") == jointly("open", "fail") == jointly("too few", "fail") == "fail"
    assert jointly("pass", "too few") == jointly("open", "too few") == "too few"
    assert jointly("pass", "open") == "open"


@pytest.mark.parametrize(("spread", "noise"), [(1.0, 0.5), (0.3, 0.1), (0.7, 1.0)])
def test_each_bound_misses_the_true_growth_at_most_5_percent(spread, noise):
    """Lognormal problem lengths (spread: the log-sd across problems), each run's own noise, a true
    growth of 1.2; at n = 10, 30 and 100."""
    misses = {n: growth_misses(n, 1.2, 1.2, TRIALS, n, spread, noise) for n in (10, 30, 100)}
    assert max(max(upper, lower) for upper, lower in misses.values()) <= ALLOWED, misses


def test_a_cap_below_some_traces_keeps_the_coverage():
    """Traces stop at 8,192 tokens (about 10% of the full cache's, 15% of the method's): the true growth,
    1.14, is the capped means' ratio."""
    method, full = token_draws(np.random.default_rng(0), 1, 400_000, 1.2, 0.8, 0.3, cap=8192)
    truth = float(method.mean() / full.mean())
    assert 1.13 < truth < 1.15 and 0.05 < (full >= 8192).mean() < (method >= 8192).mean() < 0.2
    misses = {n: growth_misses(n, 1.2, truth, TRIALS, n, 0.8, 0.3, cap=8192) for n in (10, 30, 100)}
    assert max(max(upper, lower) for upper, lower in misses.values()) <= ALLOWED, misses


@pytest.mark.parametrize("n", [100, 300])
def test_growth_at_the_bound_passes_both_targets_at_most_5_percent(n):
    """The setting keeps every answer (retention passes 0.95) and its traces grow by exactly the bound."""
    assert growth_pass_rate(n, 1.1, 1.1, TRIALS, seed=n) <= ALLOWED
    assert growth_pass_rate(n, 1.3, 1.1, TRIALS, seed=n) == 0.0


def test_growth_well_within_the_bound_passes():
    assert growth_pass_rate(300, 1.0, 1.1, TRIALS, seed=3) > 0.8  # 0.85 at seed 3


def store(db: ResultsDB, config: dict, cache: dict, tokens: list[int], scores: list[float]) -> None:
    """Store one sample per problem ``aime-<i>`` of ``config`` with ``cache``, as the runner would: its
    generated tokens, decoded at :data:`TOKENS_PER_SECOND`."""
    stored, digest = identity({**config, "cache": cache})
    run_id = db.start_run(stored, digest)
    for index, (count, score) in enumerate(zip(tokens, scores, strict=True)):
        row = {
            "sample_id": f"aime-{index}",
            "score": score,
            "output": f"\\boxed{{{index}}}",
            "target": str(index),
            "prompt_tokens": 180,
            "generated_tokens": count,
            "decode_s": count / TOKENS_PER_SECOND,
        }
        db.add_sample(run_id, digest, row)
    db.finish_run(run_id)


@pytest.fixture(scope="module")
def db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = database_url(tmp_path_factory.mktemp("output_length") / "results.sqlite")
    config = compose_config(
        "model.pretrained=acme/tiny-base", "+protocol=aime24_r1", "task.max_new_tokens=2048"
    )
    with ResultsDB(url) as db:
        store(db, config, {"method": "full"}, FULL, SOLVED)
        store(db, config, {"method": "snapstream", "budget": 256}, LONGER, SOLVED)
        store(db, config, {"method": "snapstream", "budget": 512}, SAME, SOLVED)
        store(db, config, {"method": "streaming_llm", "budget": 128}, CAP, [0.0] * 12)
    return url


def report(db_url: str, max_output_growth: float | None = None):
    with ResultsDB(db_url) as db:
        return build_report(db, (0.7,), figures=False, max_output_growth=max_output_growth)


def test_the_report_shows_longer_traces_with_their_interval(db_url):
    [table] = tables(report(db_url), "Output length")
    assert table.header[2:5] == ("Tokens, full", "Tokens, method", "Growth [95% bounds]")
    assert table.header[-2:] == ("Tokens per correct, full", "Tokens per correct, method")
    assert len(table.header) == 9  # no verdict column without --max-output-growth
    longer = growth(LONGER, FULL)
    assert row_of(table, "SnapStream 256") == (
        "SnapStream 256",
        "12",
        "1083.3",
        "1616.7",
        interval(19400 / 13000, longer.lower, longer.upper),
        "0.542",
        "0.808",
        "1300.0",
        "1940.0",
    )
    assert row_of(table, "SnapStream 256")[4].startswith("1.492 [1.4")  # growth > 1, shown
    assert row_of(table, "SnapStream 512")[2:5] == ("1083.3", "1083.3", interval(1.0, *_bounds(SAME)))
    assert row_of(table, "StreamingLLM 128")[7:] == ("1300.0", "-")  # nothing solved: no tokens per answer


def _bounds(tokens: list[int]) -> tuple[float, float]:
    bounds = growth(tokens, FULL)
    return bounds.lower, bounds.upper


def test_the_growth_target_fails_the_longer_traces_and_moves_the_decision(db_url):
    without, bounded = report(db_url), report(db_url, 1.1)
    [decision] = tables(without, "Decision")
    snapstream = next(row for row in decision.rows if row[3] == "SnapStream")
    assert snapstream[5] == Mark("256 (retention 1.000)", "pass")  # keeps 0.7: all ten solved
    [decision] = tables(bounded, "Decision: the smallest budget shown to keep each retention target with")
    assert decision.header[-1] == "Retention 0.7, growth ≤ 1.1"
    snapstream = next(row for row in decision.rows if row[3] == "SnapStream")
    assert snapstream[5] == Mark("512 (retention 1.000)", "pass")  # 256 grows 1.49: fails
    [table] = tables(bounded, "Output length")
    assert table.header[5] == "Growth ≤ 1.1"
    verdicts = {row[0]: row[5] for row in table.rows}
    assert verdicts == {
        "SnapStream 256": Mark("no", "fail"),
        "SnapStream 512": Mark("yes", "pass"),
        "StreamingLLM 128": Mark("no", "fail"),
    }
    streaming = next(row for row in decision.rows if row[3] == "StreamingLLM")
    assert streaming[5] == Mark("none of the measured budgets (largest 128: 0.000, growth 1.890)", "fail")
    assert any("requires output growth at most 1.1" in getattr(block, "text", "") for block in bounded.blocks)
    markdown = render_markdown(bounded)
    assert "### Output length" in markdown and "| SnapStream 256 | 12 | 1083.3 | 1616.7 | 1.492 [" in markdown


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "abc"])
def test_a_bad_growth_bound_ends_in_one_line(value, db_url, tmp_path, capsys):
    out = tmp_path / "report.md"
    assert main(["--db", db_url, "--out", str(out), "--markdown", "--max-output-growth", value]) == 2
    error = capsys.readouterr().err
    assert error == f"error: --max-output-growth: must be a finite number > 0 (e.g. 1.1), got {value}\n"
    assert not out.exists()


def test_the_command_takes_the_growth_bound(db_url, tmp_path):
    out = tmp_path / "report.md"
    assert main(["--db", db_url, "--out", str(out), "--markdown", "--max-output-growth", "1.1"]) == 0
    assert "| Growth ≤ 1.1 |" in out.read_text(encoding="utf-8")
