"""``python -m snapeval.lm_eval ARGS``: the lm-eval CLI with snapeval's ``snapstream`` model registered.

lm-eval discovers only its own models (it has no plugin entry point), so ``lm_eval --model snapstream``
cannot find an external one; this is the same CLI, same arguments, with the model imported first:

    python -m snapeval.lm_eval run --model snapstream \\
        --model_args pretrained=smollm2-135m,method=snapstream,budget=512,window=32,kernel=7 \\
        --include_path tasks --tasks snapeval_aime24 --limit 2
"""

from lm_eval.__main__ import cli_evaluate

import snapeval.lm_eval_model  # noqa: F401  (registers the "snapstream" model)

if __name__ == "__main__":
    cli_evaluate()
