"""A transformers that hands attention modules the cache under a name the engine does not know.

:func:`hide_the_cache` makes :func:`snapeval.cache.install` look for the cache under ``kv_store`` only, as
the engine of transformers < 5.24 looked for ``past_key_values`` only when 5.24 renamed it ``cache``:
the model still updates the cache, but the snapeval attention never receives it. Importable by a
subprocess (``python -c "import tests.bypass as b; b.hide_the_cache(); ..."``) to test a command's exit.
"""

from __future__ import annotations

from snapeval.cache import attention

UNKNOWN_NAME = "kv_store"


def hide_the_cache(monkeypatch=None) -> None:
    """Patch the engine (through pytest's ``monkeypatch`` when given, undone after the test)."""

    def unknown(module):
        return (UNKNOWN_NAME,), None

    if monkeypatch is None:
        attention.cache_names = unknown
    else:
        monkeypatch.setattr(attention, "cache_names", unknown)
