"""A deployed engine against snapeval's reference on the same samples: answer agreement with its exact
interval, retention beside snapeval's, the "compression not applied?" flag (its error rates simulated),
the report's section and the engine gate, on hand-made databases whose answers are known.

Three ports of StreamingLLM 256 on 40 passkey samples, beside snapeval's, which keeps 32 (loses 0-7):

* ``lm_eval:local-completions`` applies it: loses 0-5 and 10, its full cache snapeval's;
* ``lm_eval:vllm`` is silent: its compressed answers are its full cache's, every one;
* ``lm_eval:sglang`` diverges: its full cache words 30-39 differently, and it loses 20 and 21.
"""

from __future__ import annotations

import pytest
import yaml
from scipy.stats import beta, binom

from snapeval.commands.engine_gate import EngineGate, EngineVerdict
from snapeval.commands.gate import judge, load_gates, main
from snapeval.configs.compose import compose_config
from snapeval.report import build_report, render_html, render_markdown
from snapeval.report.document import Mark, Table
from snapeval.results import ResultsDB, database_url, identity
from snapeval.stats import Unchanged, agreement, clopper_pearson, pair_engine
from snapeval.stats.agreement import changes_to_flag
from snapeval.stats.simulation import flag_rate

from .test_report import row_of, section, tables

N = 40
TASK = ["task=ruler_passkey", "task.context_length=1024"]
CACHE = ["cache=streaming_llm", "cache.budget=256"]
APPLIES, SILENT, DIVERGES = "lm_eval:local-completions", "lm_eval:vllm", "lm_eval:sglang"
RIGHT = {i: (str(i), 1.0) for i in range(N)}


def answers(changes: dict[int, tuple[str, float]], base: dict = RIGHT) -> dict[int, tuple[str, float]]:
    return {**base, **changes}


LOST = ("lost", 0.0)
REFERENCE = answers(dict.fromkeys(range(8), LOST))
DIVERGED_FULL = answers({i: (f"answer {i}", 1.0) for i in range(30, 40)})
RUNS = {  # backend (None: snapeval) -> (full cache, StreamingLLM 256)
    None: (RIGHT, REFERENCE),
    APPLIES: (RIGHT, answers({**dict.fromkeys(range(6), LOST), 10: ("other", 0.0), 40: ("40", 1.0)})),
    SILENT: (RIGHT, RIGHT),
    DIVERGES: (DIVERGED_FULL, answers({20: LOST, 21: LOST}, DIVERGED_FULL)),
}


def store(db: ResultsDB, overrides: list[str], outputs: dict[int, tuple[str, float]], kv_bytes: int | None):
    """Store ``outputs`` as samples ``passkey-<i>`` of the config of ``overrides``, as the runner would."""
    config, digest = identity(compose_config(*overrides))
    run_id = db.start_run(config, digest)
    for index, (output, score) in outputs.items():
        row = {"sample_id": f"passkey-{index}", "output": output, "score": score, "kv_bytes": kv_bytes}
        db.add_sample(run_id, digest, row)
    db.finish_run(run_id)


@pytest.fixture(scope="module")
def db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = database_url(tmp_path_factory.mktemp("engines") / "results.sqlite")
    with ResultsDB(url) as db:
        for backend, (full, compressed) in RUNS.items():
            engine = [f"model.backend={backend}"] if backend else []
            kv_bytes = None if backend else 1 << 20  # a remote run stores none
            store(db, [*TASK, *engine, "cache=full"], full, kv_bytes)
            store(db, [*TASK, *engine, *CACHE], compressed, kv_bytes)
    return url


@pytest.fixture(scope="module")
def document(db_url):
    with ResultsDB(db_url) as db:
        return build_report(db, (0.95,), figures=False)


def engine_row(document, backend: str, setting: str) -> tuple:
    [table] = tables(document, "Engine against reference")
    return next(row for row in table.rows if row[0] == backend and row[2] == setting)


def test_agreement_is_the_share_of_identical_outputs_with_its_exact_interval():
    """Clopper-Pearson from the beta quantiles: 37 of 40 gives [0.796, 0.984]; 0 and n end at 0 and 1."""
    assert clopper_pearson(37, 40) == pytest.approx((beta.ppf(0.025, 37, 4), beta.ppf(0.975, 38, 3)))
    assert clopper_pearson(0, 10) == (0.0, pytest.approx(1 - 0.025**0.1))
    assert clopper_pearson(10, 10) == (pytest.approx(0.025**0.1), 1.0)
    same = agreement(["a", "b", "c", "d"], ["a", "b", "x", "d "])
    assert (same.same, same.n, same.share) == (2, 4, 0.5)  # the text as stored: "d " is not "d"


@pytest.mark.parametrize(
    ("changed", "reference_changed", "verdict"),
    [(0, 5, "flagged"), (0, 40, "flagged"), (0, 4, "undecided"), (0, 0, "undecided"), (1, 30, "changed")],
)
def test_the_flag_needs_no_change_by_the_engine_and_five_by_the_reference(
    changed, reference_changed, verdict
):
    """2**-5 = 0.031 <= 0.05 < 2**-4: five changed answers of snapeval's, none of the engine's."""
    assert changes_to_flag() == 5
    assert Unchanged(changed, reference_changed, 40).verdict == verdict


@pytest.mark.parametrize(
    ("n", "reference_only", "engine_only", "both", "bound"),
    [
        (5, 0.5, 0.5, 0.0, 2**-5),  # the bound is reached: both change half the answers, never the same
        (10, 0.4, 0.4, 0.0, 0.05),
        (40, 0.2 * 0.8, 0.2 * 0.8, 0.04, 0.05),  # independent changes at r = p = 0.2
        (40, 0.3, 0.1, 0.0, 0.05),  # the engine changes more often than the reference: p = 0.4 > r = 0.3
        (200, 0.02 * 0.98, 0.02 * 0.98, 0.0004, 0.05),
    ],
)
def test_a_port_that_changes_answers_as_often_as_the_reference_is_rarely_flagged(
    n, reference_only, engine_only, both, bound
):
    """False flags under the hypothesis the flag rejects (p >= r), 20,000 simulated cases each: at most
    2**-5 = 0.031, within 3 standard errors."""
    rate = flag_rate(n, reference_only, engine_only, both, trials=20_000, seed=7)
    assert rate <= min(bound, 2**-5) + 3 * (2**-5 * (1 - 2**-5) / 20_000) ** 0.5
    if n == 5:
        assert rate == pytest.approx(2**-5, abs=0.004)  # exact: the bound is tight, not loose


@pytest.mark.parametrize(("n", "r"), [(40, 0.2), (40, 0.3), (100, 0.1), (20, 0.3)])
def test_a_silent_port_is_flagged_whenever_the_reference_changes_five_answers(n, r):
    """A port that applies nothing (p = 0) is flagged when snapeval changes >= 5 of n: the binomial tail,
    0.92 at r = 0.2, n = 40 and 0.98 at r = 0.1, n = 100."""
    rate = flag_rate(n, r, 0.0, 0.0, trials=20_000, seed=11)
    assert rate == pytest.approx(binom.sf(4, n, r), abs=0.01)
    assert rate >= (0.75 if n == 20 else 0.9)


def test_the_pairing_takes_the_samples_all_four_runs_stored():
    """The applying port's sample 40 is its own: left out; 33 of 40 kept against its full cache."""
    engine_full, engine = RUNS[APPLIES]
    reference_full, reference = RUNS[None]
    pairing = pair_engine(
        *({str(k): v for k, v in a.items()} for a in (engine, reference, engine_full, reference_full))
    )
    assert (pairing.n, pairing.engine_accuracy, pairing.reference_accuracy) == (40, 33 / 40, 32 / 40)
    assert pairing.agreement.same == 37 and not pairing.flagged
    assert (pairing.unchanged.changed, pairing.unchanged.reference_changed) == (7, 8)
    for missing in range(4):  # a sample one full cache or setting lacks leaves every number
        runs = [
            {str(k): v for k, v in a.items() if k != 6 or i != missing}
            for i, a in enumerate(RUNS[APPLIES] + RUNS[None])
        ]
        [engine_full, engine, reference_full, reference] = runs
        fewer = pair_engine(engine, reference, engine_full, reference_full)
        assert (fewer.n, fewer.agreement.same, fewer.unchanged.reference_changed) == (39, 37, 7)


def test_the_section_pairs_each_engine_setting_with_snapevals(document):
    """Agreement [Clopper-Pearson 95%], each retention [one-sided 95% bounds: kept k of 40, lower bound
    p**k-... as in the decision report], and the flag, per engine and setting."""
    label = "StreamingLLM 256"
    applies = engine_row(document, APPLIES, label)
    assert applies[3:9] == (
        "40",
        "0.825",
        "0.800",
        "0.925 [0.796, 0.984]",
        "0.825 [0.696, 1.016]",
        "0.800 [0.668, 0.997]",
    )
    assert applies[9] == "applied (7 of 40 answers changed; snapeval changed 8 of 40)"
    silent = engine_row(document, SILENT, label)
    assert silent[3:9] == (
        "40",
        "1.000",
        "0.800",
        "0.800 [0.644, 0.909]",
        "1.000 [0.928, 1.097]",
        "0.800 [0.668, 0.997]",
    )
    assert silent[9] == Mark(
        "compression not applied? (0 of 40 answers changed; snapeval changed 8 of 40)", "fail"
    )
    diverges = engine_row(document, DIVERGES, label)
    assert diverges[6:8] == ("0.500 [0.338, 0.662]", "0.950 [0.851, 1.090]")
    assert diverges[9].startswith("applied (2 of 40")
    assert engine_row(document, DIVERGES, "Full cache")[3:10] == (
        "40",
        "1.000",
        "1.000",
        "0.750 [0.588, 0.873]",
        "reference",
        "reference",
        "-",
    )
    [table] = tables(document, "Engine against reference")
    assert len(table.rows) == 6 and {row[0] for row in table.rows} == {APPLIES, SILENT, DIVERGES}


def test_an_engine_runs_kv_bytes_show_a_dash_never_zero(document):
    engine = row_of(
        tables(document, "smollm2-135m · ruler_passkey (model.backend=lm_eval:vllm)")[0], "Full cache"
    )
    snapeval = row_of(tables(document, "smollm2-135m · ruler_passkey (model.backend=-)")[0], "Full cache")
    assert (engine[-2], snapeval[-2]) == ("-", "1.0")


def test_the_section_renders_in_both_formats_and_only_with_an_engine_run(document, tmp_path):
    markdown, html = render_markdown(document), render_html(document)
    assert "## Engine against reference" in markdown
    assert (
        "| lm_eval:vllm | smollm2-135m · ruler_passkey | StreamingLLM 256 | 40 | 1.000 | 0.800 |" in markdown
    )
    assert '<h2 id="engines">Engine against reference</h2>' in html
    assert '<span class="fail">compression not applied? (0 of 40' in html
    url = database_url(tmp_path / "snapeval_only.sqlite")
    with ResultsDB(url) as db:
        store(db, [*TASK, "cache=full"], RIGHT, 1 << 20)
        store(db, [*TASK, *CACHE], REFERENCE, 1 << 19)
        plain = build_report(db, (0.95,), figures=False)
    assert not [b for b in plain.blocks if getattr(b, "text", "") == "Engine against reference"]


def engine_gate(backend: str, name: str = "port", **thresholds) -> dict:
    return {
        "name": name,
        "kind": "engine",
        "task": [*TASK, "run.limit=40"],
        "backend": [f"model.backend={backend}", "model.backend_args=base_url=http://127.0.0.1:1/v1,model=m"],
        "cache": CACHE,
        "min_agreement": 0.3,
        "min_retained": 0.6,
        "min_n": 40,
        **thresholds,
    }


def spec(tmp_path, *gates: dict):
    path = tmp_path / "gates.yaml"
    path.write_text(yaml.safe_dump(list(gates)))
    return path


@pytest.fixture(scope="module")
def pairings(db_url, tmp_path_factory) -> dict:
    """Each port's default gate judged once (composing a gate's four configs takes seconds)."""
    gates = load_gates(spec(tmp_path_factory.mktemp("gates"), *map(engine_gate, (APPLIES, SILENT, DIVERGES))))
    with ResultsDB(db_url) as db:
        return {gate.backend[0].split("=", 1)[1]: judge(gate, db).pairing for gate in gates}


@pytest.mark.parametrize(
    ("backend", "thresholds", "failures"),
    [
        (APPLIES, {}, []),
        (SILENT, {}, ["compression not applied?"]),  # agreement 0.644 and retention 0.928 pass: still fails
        (DIVERGES, {}, []),
        (DIVERGES, {"min_agreement": 0.4}, ["agreement below 0.4"]),  # 20 of 40: lower end 0.338
        (APPLIES, {"min_retained": 0.7}, ["retention not shown to keep 0.7"]),  # lower bound 0.696
        (APPLIES, {"min_n": 41}, ["40 paired samples (required >= 41)"]),
    ],
)
def test_the_engine_gate_fails_on_the_flag_agreement_retention_or_n(pairings, backend, thresholds, failures):
    gate = EngineGate.from_spec(engine_gate(backend, **thresholds), "test")
    verdict = EngineVerdict(gate, pairings[backend])
    assert verdict.failures() == failures and verdict.passed == (not failures)


def test_the_gate_command_judges_engine_gates_from_the_database_and_runs_nothing(db_url, tmp_path, capsys):
    silent = spec(tmp_path, engine_gate(SILENT, "silent"))
    assert main(["--spec", str(silent), "--db", db_url]) == 1  # no --no-run: an engine gate runs nothing
    out = capsys.readouterr().out
    assert out.startswith("FAIL silent (model.backend=lm_eval:vllm model.backend_args=")
    assert "    answers changed against the full cache: the engine's 0 of 40, snapeval's 8" in out
    assert (
        "    agreement with snapeval's setting: 32 of 40 answers the same, 95% interval [0.644, 0.909]" in out
    )
    assert out.endswith("0 of 1 gates passed\n")


def test_a_passing_engine_gate_says_so_with_both_retentions(pairings):
    verdict = EngineVerdict(EngineGate.from_spec(engine_gate(APPLIES, "applies"), "test"), pairings[APPLIES])
    lines = verdict.report().splitlines()
    assert lines[0].endswith("cache.budget=256): agrees with snapeval and keeps its accuracy")
    assert lines[0].startswith("PASS applies (model.backend=lm_eval:local-completions")
    assert lines[2] == (
        "    retention against its own full cache: 0.825 [0.696, 1.016] (the lower one required >= 0.6); "
        "snapeval's: 0.800 [0.668, 0.997]"
    )


def test_the_report_shows_engine_gates_beside_retention_gates(db_url, tmp_path):
    gates = load_gates(spec(tmp_path, engine_gate(SILENT, "silent")))
    with ResultsDB(db_url) as db:
        document = build_report(db, (0.95,), figures=False, gates=gates)
    [table] = [b for b in section(document, "Accuracy gates") if isinstance(b, Table)]
    assert table.rows[0][:3] == ("silent", Mark("FAIL", "fail"), "40 (min 40)")
    assert table.rows[0][5] == "compression not applied?"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "engines"}, "[0].kind: must be retention (the default) or engine, got 'engines'"),
        ({"backend": ["task=aime24"]}, "[0].backend: must be model.backend=lm_eval:<model>"),
        ({"backend": ["model.backend=snapeval"]}, "[0].backend: model.backend: must name a deployed engine"),
        ({"min_agreement": 1.5}, "[0].min_agreement: must be a number in [0, 1], got 1.5"),
        ({"cache": ["cache=full"]}, "[0].cache: cache.method: must be a compressed cache, got full"),
        ({"min_n": None}, "[0].min_n: must be a positive integer, got None"),
    ],
)
def test_a_wrong_engine_gate_spec_ends_in_one_line(change, message, db_url, tmp_path, capsys):
    path = spec(tmp_path, {**engine_gate(APPLIES), **change})
    assert main(["--spec", str(path), "--db", db_url, "--no-run"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {path}{message}") and error.count("\n") == 1
