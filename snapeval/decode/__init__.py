"""Decoding: every answer of a run decodes in the continuous batcher, checked against a one-by-one loop.

Modules: :mod:`~snapeval.decode.generation` (prefill, append and the one-by-one reference loop against any
transformers cache; the batcher's prefills and the lm-eval model's scoring use its prefill and append),
:mod:`~snapeval.decode.sampling` (next-token choice, reproducible per row),
:mod:`~snapeval.decode.stops` (where an answer stops),
:mod:`~snapeval.decode.continuous` (the continuous batcher, its rows in capacity classes),
:mod:`~snapeval.decode.batch_rows` (how many rows a run gets, refused in one line where they would not
fit in free memory).
"""
