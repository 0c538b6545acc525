"""The `snapeval` lm-eval model: compression happens before scoring, so log-likelihoods move with it.
Scores and draws on a tiny random Llama with SmolLM2's tokenizer; answers that must make sense on the
embedded model."""

from __future__ import annotations

import pytest
import torch
from lm_eval.api.instance import Instance

from snapeval.commands.lm_eval_model import SnapStreamLM
from snapeval.errors import SnapevalError

CONTEXT = (
    "Inventory notes. Shelf A holds blue jars of honey. Shelf B holds the red boxes of tea and a brass "
    "scale. Shelf C holds wool blankets, candles and a lantern. The storeroom key is kept under the green "
    "flowerpot next to the door. Shelf D holds flour, salt and sugar in paper bags. Shelf E holds rope, "
    "nails and a hammer. Question: where is the storeroom key kept? Answer: under the"
)
CONTINUATION = " green flowerpot next to the door."


def loglikelihood(model: SnapStreamLM) -> tuple[float, bool]:
    request = Instance("loglikelihood", doc={}, arguments=(CONTEXT, CONTINUATION), idx=0)
    return model.loglikelihood([request], disable_tqdm=True)[0]


@pytest.fixture(scope="module")
def full(smollm) -> SnapStreamLM:
    lm = SnapStreamLM(pretrained="smollm2-135m", method="full")
    vars(lm)["model"] = smollm.model  # the session's weights (the engine installed), not a second load
    return lm


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder) -> str:
    """The session's 2-layer random Llama saved with SmolLM2's tokenizer: ``pretrained`` for the lm-eval
    model."""
    return str(tiny_llama_folder)


@pytest.fixture(scope="module")
def tiny_full(tiny) -> SnapStreamLM:
    return SnapStreamLM(pretrained=tiny, method="full")


def test_full_cache_loglikelihood_equals_a_plain_forward_pass(tiny_full):
    context = tiny_full._encode(CONTEXT)
    continuation = tiny_full._encode(CONTEXT + CONTINUATION)[len(context) :]
    with torch.inference_mode():
        logits = tiny_full.model(input_ids=torch.tensor([context + continuation])).logits[0].float()
    expected = (
        logits[len(context) - 1 : -1].log_softmax(-1).gather(-1, torch.tensor(continuation)[:, None]).sum()
    )
    assert loglikelihood(tiny_full)[0] == pytest.approx(float(expected), abs=1e-3)


def test_budget_holding_the_prompt_gives_the_full_loglikelihood(tiny, tiny_full):
    roomy = SnapStreamLM(pretrained=tiny, method="snapstream", budget=4096)
    assert loglikelihood(roomy)[0] == pytest.approx(loglikelihood(tiny_full)[0], abs=1e-4)


def test_small_budget_changes_the_loglikelihood(tiny, tiny_full):
    tight = SnapStreamLM(pretrained=tiny, method="snapstream", budget=40, window=8, kernel=3, ring=16)
    assert abs(loglikelihood(tight)[0] - loglikelihood(tiny_full)[0]) > 0.05


def test_generate_until_stops_at_the_stop_string(full):
    request = Instance(
        "generate_until",
        doc={},
        arguments=(
            full.apply_chat_template([{"role": "user", "content": "Count from 1 to 20."}]),
            {"until": ["5"], "max_gen_toks": 64},
        ),
        idx=0,
    )
    output = full.generate_until([request], disable_tqdm=True)[0]
    assert "5" not in output and "4" in output


def test_repeated_sampled_requests_are_different_draws_and_reproducible(tiny, tiny_full):
    """lm-eval's ``repeats`` (n samples per problem, pass@1 as their mean) sends identical requests."""
    full = tiny_full
    prompt = full.apply_chat_template([{"role": "user", "content": "Write a short poem about the sea."}])
    sampled = {"until": [], "max_gen_toks": 12, "do_sample": True, "temperature": 1.0}
    requests = [Instance("generate_until", doc={}, arguments=(prompt, sampled), idx=0) for _ in range(2)]
    first = full.generate_until(requests, disable_tqdm=True)  # decoded together: one prefill, two rows
    assert first[0] != first[1]
    assert full.generate_until(requests, disable_tqdm=True) == first
    one_by_one = SnapStreamLM(pretrained=tiny, method="full", batch_size=1)
    assert one_by_one.generate_until(requests, disable_tqdm=True) == first


@pytest.mark.slow  # the embedded model decoding twice (.ci/run runs it); test_continuous.py has the rest
def test_batch_size_batches_different_requests_with_the_same_answers(full, smollm):
    """lm-eval's --batch_size: rows of the continuous batcher, answers as one by one."""
    questions = ["Count from 1 to 20.", "Name three colours.", "What is the capital of France?"]
    requests = [
        Instance(
            "generate_until",
            doc={},
            arguments=(
                full.apply_chat_template([{"role": "user", "content": q}]),
                {"until": ["7"], "max_gen_toks": 24},
            ),
            idx=0,
        )
        for q in questions
    ]
    cache = {"method": "snapstream", "budget": 24, "window": 4, "kernel": 3, "ring": 8}
    batched = SnapStreamLM(pretrained="smollm2-135m", batch_size="2", **cache)  # a row is refilled
    one_by_one = SnapStreamLM(pretrained="smollm2-135m", batch_size=1, **cache)
    vars(batched)["model"] = vars(one_by_one)["model"] = smollm.model  # the session's weights
    answers = batched.generate_until(requests, disable_tqdm=True)
    assert answers == one_by_one.generate_until(requests, disable_tqdm=True)
    assert "Paris" in answers[2] and "7" not in answers[0]


def test_the_weights_load_at_the_first_request_not_before(tiny):
    """lm-eval builds the model before it reads the tasks' data: a data error comes first."""
    lm = SnapStreamLM(pretrained=tiny, method="full")
    assert "model" not in vars(lm) and "batcher" not in vars(lm)
    assert loglikelihood(lm)[0] < 0
    assert "model" in vars(lm)


def test_batch_size_auto_falls_back_to_eight_and_nonsense_is_refused(tiny):
    assert SnapStreamLM(pretrained=tiny, method="full", batch_size="auto:4").batch_size == 8
    assert SnapStreamLM(pretrained=tiny, method="full", batch_size="3").batch_size == 3
    for nonsense in ("many", 0, "-2"):
        with pytest.raises(SnapevalError, match=r"^batch_size: must be an integer >= 1 or auto, got "):
            SnapStreamLM(pretrained=tiny, method="full", batch_size=nonsense)


@pytest.mark.parametrize(
    ("argument", "value", "takes"),
    [
        ("compression", "query_first", "one of query_aware, query_agnostic or null"),  # null: query_aware
        ("compile", "always", "one of auto, on, off, graphs"),
        ("dtype", "float8", "one of auto, float32, bfloat16, float16"),
        ("device", "tpu", "auto, cpu, mps, cuda or cuda:N"),
    ],
)
def test_model_arguments_take_the_values_of_their_config_fields(argument, value, takes):
    """Refused before the tokenizer or the weights load, in the words of the config field's check."""
    with pytest.raises(SnapevalError) as error:
        SnapStreamLM(pretrained="no/such-model", method="full", **{argument: value})
    assert str(error.value) == f"{argument}: must be {takes}, got {value!r}"


def test_a_draft_that_names_a_path_is_refused_as_the_run_plan_refuses_it():
    """The lm-eval model checks the drafts a cache names with the run plan's check (snapeval.run.plan)."""
    with pytest.raises(
        SnapevalError, match=r"^cache\.draft: no model '\.\./weights': give self, a model config"
    ):
        SnapStreamLM(pretrained="no/such-model", method="speculative_prefill", draft="../weights")
