"""The run pipeline: a config checked into a plan (:mod:`.plan`), executed (:mod:`.runner`) as named steps
(:mod:`.evaluation`) of its points (:mod:`.points`) over requests (:mod:`.requests`, :mod:`.prompting`),
with workers sharing a point through claims (:mod:`.workers`), records of what ran (:mod:`.records`) and
sweeps (:mod:`.sweep`)."""
