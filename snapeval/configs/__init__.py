"""The typed config tree: one dataclass per node, registered in Hydra's ConfigStore; torch-free.

- :mod:`~snapeval.configs.fields`: :func:`~snapeval.configs.fields.setting` (a field's default, check,
  and whether it is stored and hashed) and the checks;
- :mod:`~snapeval.configs.root` (the root, ``run``, ``generation``, ``protocol``),
  :mod:`~snapeval.configs.task` (one schema per kind of task), :mod:`~snapeval.configs.model`,
  :mod:`~snapeval.configs.cache` (one dataclass per cache method);
- :mod:`~snapeval.configs.store` registers them for ``conf/``; :mod:`~snapeval.configs.compose` composes
  ``conf/`` from Python; :mod:`~snapeval.configs.check` checks a composed config;
  :mod:`~snapeval.configs.legacy` maps old key spellings to today's.
- :mod:`~snapeval.configs.footprint`: what a row holds (slots per layer, bytes per slot), the one count
  the engine, the batcher's memory check and the memory estimator share.
"""
