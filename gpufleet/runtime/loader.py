"""A ``DataLoader`` that a preempted, resized or rolled-back run reads from where it stood.

``iter(DataLoader)`` draws its base seed from the *global* torch RNG unless the loader has a
``generator`` of its own. The session restores that RNG exactly, so a run resumed mid-epoch that
builds a fresh iterator draws one number more than the uninterrupted run did: every dropout mask
after it differs, and the resumed weights drift from the uninterrupted ones without any error.
Skipping to the position by iterating the loader also loads (and augments) every skipped batch.

:class:`ResumableLoader` owns the few lines every script would otherwise write: one generator
per epoch seeded from ``(seed, epoch)`` (the global RNG is never touched), ``set_epoch`` on the
sampler, and the epoch's index list sliced at the session's ``data_position`` (skipped batches are
never loaded). It rebuilds itself whenever the position is not the one it expected (a resume, a
rollback, a ``report(batches=...)``)::

    loader = ResumableLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset), seed=0)
    with TrainSession.from_env(model=model, optimizer=opt, total_steps=loader.steps(epochs=3)) as s:
        for step, (x, y) in loader.over(s):
            ...
            s.report(loss)  # one batch, one data position

It also tells the session its global batch (per-rank batch x ranks), which each checkpoint records:
a resume on another world size that changes the global batch or the number of steps says so
(``gpufleet.runtime.state.run_change``) instead of silently reading the data position in other units.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler

from gpufleet.errors import ParameterError
from gpufleet.runtime.data import position_seed

_OWNED = ("sampler", "batch_sampler", "shuffle", "generator")
"""DataLoader arguments the loader sets itself: given too, they would undo what it is for."""


class DataSession(Protocol):
    """What :meth:`ResumableLoader.over` needs of a ``TrainSession``."""

    data_position: int

    def steps(self) -> Iterator[int]: ...
    def note_data(self, *, global_batch: int, epoch_batches: int | None = None) -> None: ...


class ResumableLoader:
    """Batches as a pure function of the data position: ``(epoch, batch)`` from any position on.

    ``sampler`` may be a ``DistributedSampler`` (its own ``seed`` and ``set_epoch`` decide the
    order; ``num_replicas`` counts into the global batch) or any sampler whose order does not come
    from the global RNG; without one, ``shuffle=True`` permutes the dataset with a generator seeded
    from ``(seed, epoch)``. Other keyword arguments go to each epoch's ``DataLoader``
    (``num_workers``, ``collate_fn``, ``pin_memory``...). Worker processes are seeded from the
    epoch's generator: a transform that draws random numbers in a worker is reproducible per
    epoch, not per batch, so it resumes mid-epoch with other numbers.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        batch_size: int,
        shuffle: bool = False,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        seed: int = 0,
        drop_last: bool = False,
        **dataloader_kwargs: Any,
    ) -> None:
        if batch_size < 1:
            raise ParameterError("ResumableLoader({batch_size}): give a batch of at least 1", batch_size=batch_size)
        owned = sorted(set(dataloader_kwargs) & set(_OWNED))
        if owned:
            raise ParameterError(
                "ResumableLoader({name!r}=...): the loader sets it itself; give shuffle=, sampler= and seed= instead",
                name=owned[0],
            )
        if sampler is not None and shuffle:
            raise ParameterError(
                "ResumableLoader({shuffle}) with a sampler: the sampler decides the order; drop shuffle",
                shuffle=shuffle,
            )
        if isinstance(sampler, RandomSampler) and sampler.generator is None:
            raise ParameterError(
                "ResumableLoader({sampler!s}): a RandomSampler without a generator draws its order from the "
                "global RNG; use shuffle=True and seed= instead",
                sampler=type(sampler).__name__,
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.sampler = sampler
        self.seed = seed
        self.drop_last = drop_last
        self.kwargs = dataloader_kwargs
        self.epoch = 0
        """The epoch of the batch last yielded."""
        if len(self) == 0:
            raise ParameterError(
                "ResumableLoader({batch_size}, {drop_last}): an epoch of {examples} examples holds no batch; "
                "give a smaller batch_size or drop_last=False",
                batch_size=batch_size,
                drop_last=drop_last,
                examples=self._examples(),
            )

    def _examples(self) -> int:
        """Examples per epoch on this rank (a ``DistributedSampler``'s share)."""
        source = self.sampler if self.sampler is not None else self.dataset
        if not isinstance(source, Sized):
            raise ParameterError(
                "ResumableLoader({what!s}): the number of examples must be known (define __len__)",
                what=type(source).__name__,
            )
        return len(source)

    def __len__(self) -> int:
        """Batches per epoch on this rank: one data position each."""
        examples = self._examples()
        return examples // self.batch_size if self.drop_last else -(-examples // self.batch_size)

    @property
    def world_size(self) -> int:
        """Ranks the sampler splits each epoch over (its ``num_replicas``; 1 without one)."""
        replicas = getattr(self.sampler, "num_replicas", 1)
        return replicas if isinstance(replicas, int) and replicas > 0 else 1

    @property
    def global_batch(self) -> int:
        """Examples one step reads over all ranks: the per-rank batch times the ranks."""
        return self.batch_size * self.world_size

    def steps(self, epochs: int, micro_batches: int = 1) -> int:
        """``total_steps`` for ``epochs`` epochs at ``micro_batches`` batches a step (it moves with the world size)."""
        if epochs < 1 or micro_batches < 1:
            raise ParameterError(
                "ResumableLoader.steps({epochs}, {micro_batches}): give at least 1 of each",
                epochs=epochs,
                micro_batches=micro_batches,
            )
        return epochs * len(self) // micro_batches

    def locate(self, position: int) -> tuple[int, int]:
        """The epoch of data position ``position`` and its batch within the epoch."""
        if position < 0:
            raise ParameterError("ResumableLoader.locate({position}): a data position is 0 or more", position=position)
        return divmod(position, len(self))

    def _order(self, epoch: int) -> list[int]:
        """The epoch's indices, in order, on this rank; the global RNG is not touched."""
        if self.sampler is not None:
            set_epoch = getattr(self.sampler, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)
            return list(iter(self.sampler))
        n = self._examples()
        if not self.shuffle:
            return list(range(n))
        return torch.randperm(n, generator=_generator(self.seed, epoch)).tolist()

    def epoch_loader(self, epoch: int, start: int = 0) -> DataLoader[Any]:
        """The ``DataLoader`` of ``epoch`` from its batch ``start`` on: the indices before it are never read."""
        indices = self._order(epoch)[start * self.batch_size :]
        return DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=indices,
            drop_last=self.drop_last,
            generator=_generator(self.seed, epoch),
            **self.kwargs,
        )

    def batches(self, position: int = 0) -> Iterator[tuple[int, Any]]:
        """``(epoch, batch)`` from data position ``position`` on, epoch after epoch, without end."""
        epoch, start = self.locate(position)
        while True:
            for batch in self.epoch_loader(epoch, start):
                self.epoch = epoch
                yield epoch, batch
            epoch, start = epoch + 1, 0

    def over(self, session: DataSession, micro_batches: int = 1) -> Iterator[tuple[int, Any]]:
        """``(step, batch)`` for each step of ``session.steps()``, the batch at ``session.data_position``.

        With ``micro_batches=N`` (gradient accumulation) each step gets the list of the next N
        batches; report the N losses (``s.report(losses)``), which moves the position by N. The
        first step (a fresh start or a resume) and any step whose position is not the one after
        the last batch (a rollback) start a new iterator there.
        """
        if micro_batches < 1:
            raise ParameterError("ResumableLoader.over({micro_batches}): give at least 1", micro_batches=micro_batches)
        session.note_data(global_batch=self.global_batch * micro_batches, epoch_batches=len(self))
        stream: Iterator[tuple[int, Any]] | None = None
        expected = -1
        for step in session.steps():
            position = session.data_position
            if stream is None or position != expected:
                stream = self.batches(position)
            batches = [next(stream)[1] for _ in range(micro_batches)]
            expected = position + micro_batches
            yield step, batches[0] if micro_batches == 1 else batches


def _generator(seed: int, epoch: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(position_seed(seed, epoch))
    return generator


__all__ = ["DataSession", "ResumableLoader"]
