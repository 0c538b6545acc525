"""The results database of a tensor-parallel run: rank 0 (the writer) opens, reads and writes it; every
other rank opens nothing and gets each answer rank 0 got, broadcast.

Under torchrun every rank runs the same evaluation, so that all of them make the same model calls in the
same order (a call is a collective over the ranks' shards). What they decide from the database (the
samples still to do, those claimed, the full cache's outputs) must then be the same too: a
:class:`MirroredDB` call runs on the writer alone and broadcasts its return value, or its error, to the
others. A lease's renewal (a background thread's call) runs on the writer alone, and is not broadcast.
No torch unless the world is larger than one.
"""

from __future__ import annotations

from typing import Any

from snapeval.errors import SnapevalError

WRITER_ONLY = frozenset({"renew", "close"})  # calls that run on the writer and are not broadcast


class MirroredDB:
    """A :class:`~snapeval.results.ResultsDB` on the writer (``db``), its broadcast answers on every
    other rank (``db`` None); ``tensor_parallel`` ranks in all."""

    def __init__(self, db: Any | None, url: str, tensor_parallel: int) -> None:
        self.db, self.url, self.tensor_parallel = db, url, tensor_parallel

    def __enter__(self) -> MirroredDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self.db is not None:
            self.db.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("db", "url", "tensor_parallel"):
            raise AttributeError(name)
        if name in WRITER_ONLY:
            return getattr(self.db, name) if self.db is not None else _nothing
        if name == "engine":  # disposed of after a failed write: the writer's, or nothing to dispose of
            return self.db.engine if self.db is not None else _Inert()

        def mirrored(*args: Any, **kwargs: Any) -> Any:
            if self.db is None:
                return _broadcast(None, None)
            try:
                result = getattr(self.db, name)(*args, **kwargs)
            except Exception as error:
                _broadcast(None, f"{type(error).__name__}: {error}")
                raise
            return _broadcast(result, None)

        return mirrored


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


class _Inert:
    """What a rank that opened no database has for the writer's engine: every method does nothing."""

    def __getattr__(self, name: str) -> Any:
        return _nothing


def _broadcast(result: Any, error: str | None) -> Any:
    """The writer's ``(result, error)`` on every rank; an error there ends the others in one line."""
    import torch.distributed as dist

    carried = [(result, error)]
    dist.broadcast_object_list(carried, src=0)
    result, error = carried[0]
    if error is not None and dist.get_rank() != 0:
        raise SnapevalError(f"the writer (rank 0) failed on the results database: {error}", "run.db")
    return result


def open_results(url: str, size: int = 1, rank: int = 0) -> Any:
    """The results database at ``url`` as rank ``rank`` of a world of ``size`` sees it: itself in a world of
    one; under tensor parallel a :class:`MirroredDB`, opened on rank 0 alone, its runs recording ``size``."""
    from snapeval.results import ResultsDB

    if size == 1:
        return ResultsDB(url)
    return MirroredDB(ResultsDB(url, tensor_parallel=size) if rank == 0 else None, url, size)
