"""Drive the phases of several DDP buckets' reductions so communication overlaps the backward.

A reduction is a generator of phases (Reducer.reduce_steps): each phase starts collectives with
async_op=True. PowerSGD has two (P, then Q, which needs the reduced P); Top-K and the dense
tensors one. DDP hands us bucket after bucket while the backward pass goes on; we start each
bucket's first phase at once and return a Future, and we start a bucket's next phase at the
following bucket's hook, when its collectives have had the backward of that bucket to complete.

Every collective is started here, on the thread that runs DDP's hooks, in bucket order, so all
ranks issue them in the same order (gloo and NCCL match collectives by the order they are
issued). torch's powerSGD_hook issues its second all-reduce from a Future callback instead,
whose order across buckets depends on which bucket's first all-reduce finished first. Only the
final, local part of a reduction (decompression, the error memory, copying back) runs in the
callback, on whichever thread completed the last collective.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import torch

from .base import Phase


class _Job:
    def __init__(self, steps: Generator[Phase, None, None], finish: Callable[[], torch.Tensor]):
        self.steps = steps
        self.finish = finish  # local work once the reduction is done; returns the bucket buffer
        self.result: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self.phase: Phase | None = None

    def start(self) -> None:
        self._enter(next(self.steps, None))

    def advance(self) -> None:
        """Wait for this phase's collectives, then run the next phase (it starts new ones)."""
        for work in self.phase.works:
            work.wait()
        self._enter(next(self.steps, None))

    @property
    def waiting(self) -> bool:
        """True while a later phase still has collectives to start."""
        return self.phase is not None and not self.phase.final

    def _enter(self, phase: Phase | None) -> None:
        self.phase = phase
        if phase is None:  # nothing was sent (one worker): already complete
            self._complete()
        elif phase.final:
            if not phase.works:
                self._complete()
            else:
                done = torch.futures.collect_all([w.get_future() for w in phase.works])
                done.then(lambda _: self._complete())

    def _complete(self) -> None:
        try:
            if next(self.steps, None) is not None:  # runs the final, local part of the reduction
                raise RuntimeError("a reduction started collectives after its final phase")
            self.result.set_result(self.finish())
        except BaseException as exc:  # the Future must complete, or DDP would wait forever
            self.result.set_exception(exc)


class BucketPipeline:
    """The reductions of one backward pass, started in bucket order, completed asynchronously."""

    def __init__(self):
        self._waiting: list[_Job] = []

    def submit(self, steps: Generator[Phase, None, None], finish: Callable[[], torch.Tensor],
               last: bool) -> torch.futures.Future[torch.Tensor]:
        """Start one bucket's reduction after moving every earlier bucket one phase on; the last
        bucket of the backward also drives all of them to their final phase."""
        try:
            for job in self._waiting:
                job.advance()
            job = _Job(steps, finish)
            job.start()
            self._waiting = [j for j in self._waiting + [job] if j.waiting]
            while last and self._waiting:
                for job_ in self._waiting:
                    job_.advance()
                self._waiting = [j for j in self._waiting if j.waiting]
        except BaseException:
            self._waiting = []
            raise
        return job.result

    def reset(self) -> None:
        self._waiting = []
