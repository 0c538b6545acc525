"""Decoding: the one-by-one path (:mod:`.generation`), sampling (:mod:`.sampling`), stops (:mod:`.stops`),
the continuous batcher and its row classes (:mod:`.continuous`) and what a batch's rows hold
(:mod:`.batch_rows`)."""
