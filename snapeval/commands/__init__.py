"""The commands that compose the rooms below them: the accuracy gate (:mod:`.gate`; its engine gate,
:mod:`.engine_gate`, and the checks every gate's spec shares, :mod:`.gate_spec`), the budget search
(:mod:`.search`), the lm-eval model, its plugin and the task index it extends (:mod:`.lm_eval_model`,
:mod:`.lm_eval_plugin`, :mod:`.lm_eval_tasks`), the checks a run passes before it starts, shared by
``python -m snapeval`` and ``snapeval.evaluate`` (:mod:`.evaluate`), and the ``snapeval`` console script
(:mod:`.console`)."""
