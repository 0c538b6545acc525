"""The commands that compose the rooms below them: the accuracy gate (:mod:`.gate`), the budget search
(:mod:`.search`), the lm-eval model and its plugin (:mod:`.lm_eval_model`, :mod:`.lm_eval_plugin`) and the
``snapeval`` console script (:mod:`.console`)."""
