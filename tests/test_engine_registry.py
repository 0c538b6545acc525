"""lm-eval's own clients are found whatever registered first: lm-eval 0.4.13 loads its built-in models
lazily, and a plugin's model registered before that (snapeval's own hook registers ``snapeval``) used to
hide them, so ``model.backend=lm_eval:local-completions`` was refused as unknown."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

@register_model("a-plugin-registered-first")
class Plugin(LM):
    pass

from snapeval.backends.lm_eval import make_client

client = make_client("local-completions", "base_url=http://127.0.0.1:9/v1/completions,model=m")
print(type(client).__name__)
"""


def test_a_plugin_registered_first_hides_no_built_in_client():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1].endswith("CompletionsAPI"), done.stdout
