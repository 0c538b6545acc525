"""The offline RULER-style family for lm-eval, generated with the evaluated model's tokenizer.

Metadata: ``pretrained`` (a snapeval model name such as ``smollm2-135m``, a Hub id or a path),
``context_length``, ``num_samples``, ``seed``.
"""

import datasets

from snapeval import synthetic
from snapeval.models import load_tokenizer, model_spec


def load(
    kind: str,
    pretrained: str = "smollm2-135m",
    context_length: int = 1024,
    num_samples: int = 50,
    seed: int = 0,
    **_metadata,
) -> datasets.DatasetDict:
    tokenizer = load_tokenizer(model_spec(pretrained))
    samples = synthetic.generate(kind, tokenizer, int(context_length), int(num_samples), int(seed))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(synthetic.to_docs(samples))})


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return {"score": synthetic.score(results[0], doc["targets"], synthetic.SCORE_MODES[doc["kind"]])}
