"""The request builder shared by the runner and the lm-eval model: the same prompt gives the same ids,
split, seed and stop ids through either, on a tiny tokenizer (one that adds a BOS) and a tiny model."""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast

from snapeval.commands.lm_eval_model import SnapStreamLM
from snapeval.configs.compose import compose_config
from snapeval.decode.continuous import ContinuousBatcher
from snapeval.decode.sampling import Sampling
from snapeval.decode.stops import stop_ids
from snapeval.errors import SnapevalError
from snapeval.run import evaluation, runner
from snapeval.run.prompting import truncate_middle
from snapeval.run.requests import RequestBuilder, sample_seed, sampling
from snapeval.tasks.base import RAW_ROLE
from tests.families import FAMILIES

QUERY = "What is the correct answer to this question:"
DOCUMENT = " ".join(f"Sentence number {i} of the document." for i in range(120))
CORPUS = [DOCUMENT, f"{QUERY} x? Count from 1 to 20. Shelf A holds blue jars of honey. Paris."]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GREEDY = Sampling()
FULL = {"method": "full"}


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of ~400 tokens trained on the test texts, with a chat template; it adds a BOS
    when asked for special tokens (as Llama's does), so the two encoding conventions differ."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<s>", "<|im_end|>", "<|im_start|>", "<pad>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=alphabet, show_progress=False
    )
    bpe.train_from_iterator(CORPUS * 10, trainer)
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        chat_template=TEMPLATE,
    )


@pytest.fixture(scope="module")
def tiny_folder(tokenizer, tmp_path_factory):
    """A 2-layer random Llama with the tiny tokenizer, saved: a model both the runner and lm-eval load.
    Its generation config ends an answer at a second token besides the tokenizer's EOS (an end of turn)."""
    folder = tmp_path_factory.mktemp("tiny_requests")
    model = FAMILIES["llama"](len(tokenizer))
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, end_of_turn(tokenizer)]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def end_of_turn(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|im_start|>")


def chat(content: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]


def runner_builder(tokenizer, window=4096, truncation="error", query_start=None, max_prompt_tokens=None):
    task = type("Task", (), {"truncation": truncation, "query_start": query_start})()
    task.max_prompt_tokens = max_prompt_tokens
    return RequestBuilder.for_task(tokenizer, task, window, stop_ids(tokenizer, None))


def lm_eval_builder(tokenizer, window=4096, query_start=None):
    """What :class:`SnapStreamLM` builds (its test below checks it is this one)."""
    eos = stop_ids(tokenizer, None)
    return RequestBuilder(tokenizer, window, eos, truncation="middle", cut_ids=True, query_start=query_start)


def test_a_runner_request_equals_the_lm_eval_request_for_the_same_prompt(
    tokenizer, tiny_folder, tmp_path, monkeypatch, one_torch_thread
):
    """The requests a real run queues, and lm-eval's for each prompt's chat text: the same ids, split,
    length, seed (the sample's) and stop ids."""
    queued = []

    class Recording(ContinuousBatcher):
        def reserve(self, requests):
            queued.extend(requests)
            return super().reserve(requests)

    monkeypatch.setattr(evaluation, "ContinuousBatcher", Recording)
    cfg = compose_config(
        f"run.db={tmp_path / 'db.sqlite'}",
        "run.progress=false",
        f"model.pretrained={tiny_folder}",
        "model.name=tiny",
        "task=ruler_passkey",
        "run.limit=2",
        "task.context_length=512",
        "task.max_new_tokens=3",
    )
    [summary] = runner.run(cfg)
    by_prompt = {request.tag.prompt.id: request for request in queued}
    assert summary.computed == 2 and len(by_prompt) == 2
    lm = SnapStreamLM(pretrained=str(tiny_folder), method="full")
    for ours in by_prompt.values():
        prompt = ours.tag.prompt
        seed = sample_seed(cfg["seed"], prompt.id)
        gen_kwargs = {"until": [], "max_gen_toks": 3, "seed": seed}
        theirs = lm._request(0, (lm.apply_chat_template(prompt.messages), gen_kwargs))
        assert 480 <= len(ours.prompt_ids) <= 512
        assert ours.sampling == theirs.sampling == Sampling(seed=seed)
        assert ours.stop_ids == theirs.stop_ids == {tokenizer.eos_token_id, end_of_turn(tokenizer)}
        assert ours.cache.is_full and theirs.cache.is_full
        assert replace(ours, tag=None, cache=FULL) == replace(theirs, tag=None)


def test_the_lm_eval_model_builds_with_its_window_split_and_truncation(tokenizer, tiny_folder):
    lm = SnapStreamLM(
        pretrained=str(tiny_folder), compression="query_agnostic", query_start=QUERY, max_length=300
    )
    context = lm.apply_chat_template(chat(f"{DOCUMENT} {QUERY} x?"))
    gen_kwargs = {"until": ["7"], "max_gen_toks": 20, "do_sample": True, "temperature": 0.5, "seed": 4}
    request = lm._request(3, (context, gen_kwargs))
    expected = lm_eval_builder(tokenizer, 300, QUERY).encode(context, 20)
    assert (request.prompt_ids, request.compress_at) == expected
    assert len(request.prompt_ids) == 280 and request.compress_at is None  # cut: no query split
    assert request.sampling == Sampling(do_sample=True, temperature=0.5, seed=4 + 3)
    assert request.tag == (3, ("7",))
    assert request.should_stop(tokenizer("1, 2, 7", add_special_tokens=False)["input_ids"])
    roomy = SnapStreamLM(pretrained=str(tiny_folder), compression="query_agnostic", query_start=QUERY)
    request = roomy._request(0, (context, gen_kwargs))
    assert tokenizer.decode(request.prompt_ids[request.compress_at :]).startswith(f"{QUERY} x?")
    aware = SnapStreamLM(pretrained=str(tiny_folder), compression="query_aware", query_start=QUERY)
    assert aware._request(0, (context, gen_kwargs)).compress_at is None  # all of it compressed


def test_chat_messages_and_their_text_split_at_the_query_alike(tokenizer):
    messages = chat(f"{DOCUMENT}\n\n{QUERY} x?")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids, split = runner_builder(tokenizer, query_start=QUERY).encode(messages, 16)
    assert (ids, split) == lm_eval_builder(tokenizer, query_start=QUERY).encode(text, 16)
    assert tokenizer.decode(ids[split:]) == f"{QUERY} x?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(ids[:split]).endswith("number 119 of the document.\n\n")
    whole = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert runner_builder(tokenizer).encode(messages, 16) == (tuple(whole), None)
    # a query at the very start leaves nothing to compress before it: no split
    assert runner_builder(tokenizer, query_start=QUERY).encode(f"{QUERY} x? {DOCUMENT}", 16)[1] is None


def test_a_text_is_encoded_without_special_tokens_and_a_raw_message_with_them(tokenizer):
    """lm-eval's contexts as lm-eval encodes them; a raw prompt as vLLM does (lcb_runner): a BOS first."""
    builder = runner_builder(tokenizer)
    text = "Shelf A holds blue jars of honey."
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert builder.encode(text, 8) == (tuple(plain), None)
    assert builder.encode([{"role": RAW_ROLE, "content": text}], 8) == (
        (tokenizer.bos_token_id, *plain),
        None,
    )


def test_the_runner_cuts_the_last_message_text_and_lm_eval_the_ids(tokenizer):
    messages = chat(f"BEGIN {DOCUMENT} {QUERY} x?")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids, split = runner_builder(tokenizer, 300, "middle", QUERY).encode(messages, 20)
    assert 275 <= len(ids) <= 280  # re-encoding the cut text may merge a token or two
    assert tokenizer.decode(ids[split:]).startswith(f"{QUERY} x?")  # the query survives the cut
    assert tokenizer.decode(ids).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nBEGIN"
    )
    full, _ = lm_eval_builder(tokenizer, query_start=QUERY).encode(text, 20)
    assert lm_eval_builder(tokenizer, 300, QUERY).encode(text, 20) == (
        tuple(truncate_middle(full, 280)),
        None,
    )
    # the protocol's budget on the last message's text comes before the window
    budget = runner_builder(tokenizer, 4096, "error", None, max_prompt_tokens=101).encode(messages, 20)[0]
    content = tokenizer.decode(budget).split("user\n")[1]
    assert content.startswith("BEGIN Sentence number 0") and "number 60 of" not in content


def test_a_prompt_too_long_is_refused_naming_the_truncation_setting(tokenizer):
    messages = chat(DOCUMENT)
    excess = len(runner_builder(tokenizer).encode(messages, 0)[0]) - 280
    expected = (
        f"task.truncation: a prompt is {excess} tokens longer than the model's window minus max_new_tokens"
    )
    for cut_ids in (False, True):
        builder = runner_builder(tokenizer, 300)
        builder.cut_ids = cut_ids
        with pytest.raises(SnapevalError) as error:
            builder.encode(messages, 20)
        assert str(error.value).startswith(expected)
    with pytest.raises(SnapevalError, match="task.max_new_tokens: the model's window cannot hold"):
        runner_builder(tokenizer, 30, "middle").encode(messages, 20)


def test_seeds_depend_on_the_run_seed_and_the_sample_alone():
    assert sample_seed(0, "passkey/3") == zlib.crc32(b"passkey/3")
    assert sample_seed(1, "a") == 1_000_003 + zlib.crc32(b"a") == 3905355910
    assert sample_seed(7, "a#answer") == 7_000_021 + zlib.crc32(b"a#answer") == 3969157024
    assert sampling({"do_sample": True, "temperature": 0.7, "top_p": 0.9}, 5) == Sampling(True, 0.7, 0.9, 5)
    assert sampling({"temperature": None, "top_p": 0}, 2**64 + 3) == Sampling(False, 1.0, 1.0, 3)


def test_stop_ids_are_the_tokenizers_eos_and_every_eos_of_the_generation_config(tokenizer):
    eos = tokenizer.eos_token_id
    assert stop_ids(tokenizer, GenerationConfig(eos_token_id=[eos, 5])) == frozenset({eos, 5})
    assert stop_ids(tokenizer, GenerationConfig(eos_token_id=7)) == {eos, 7}
    assert stop_ids(tokenizer, GenerationConfig()) == stop_ids(tokenizer, None) == {eos}


def test_draws_of_one_prompt_share_its_encoding_and_stop_check(tokenizer):
    builder = runner_builder(tokenizer)
    first, second = (
        builder.request(chat("Count from 1 to 20."), 8, FULL, Sampling(seed=k), ("7",), k) for k in (0, 1)
    )
    assert first.prompt_ids is second.prompt_ids and first.should_stop is second.should_stop
    assert first.prefill_key() == second.prefill_key()
    longer = builder.request(chat("Count from 1 to 20."), 9, FULL, GREEDY)
    assert longer.prompt_ids == first.prompt_ids and longer.should_stop is None
