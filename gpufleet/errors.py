"""One exception tree for everything a user can cause, named by what happened.

::

    GpufleetError                 base; every message names the bad value and the fix
    ├── SpecError                 a JobSpec (YAML) that does not validate                 exit 2, HTTP 400
    ├── UsageError                a bad command-line value, a bad path                    exit 2, HTTP 400
    │   ├── ParameterError        a bad argument of a library function, named as the      exit 2, HTTP 422
    │   │                         function spells it
    │   ├── NotFound              an unknown job, attempt, model, version or sweep named  exit 2, HTTP 404
    │   └── Conflict              it exists, in the wrong state (not queued, already      exit 2, HTTP 409
    │                             over, held, running)
    ├── CheckpointError           nothing restorable, or a checkpoint that fails          exit 1
    │   │                         verification
    │   ├── CorruptCheckpoint     a checkpoint whose manifest or files do not verify
    │   ├── ForeignCheckpoint     a sound checkpoint of another job, or lacking what this job saves
    │   └── CheckpointSpaceError  a save that found the disk full (nothing earlier is touched)
    ├── HealthError               training kept producing unhealthy steps after rollbacks exit 1
    ├── StoreError                the state database cannot be opened or is from a newer  exit 2
    │                             version
    └── ServiceUnavailable        a service a command needs does not answer, and how to   exit 3, HTTP 503
        │                         start it
        └── Timeout               it was waited for and did not answer in time (an actor) exit 3, HTTP 504

Each class says how it ends in two class attributes: ``exit_code`` (the CLI prints the message as
one line on stderr and exits with it, never a traceback) and ``http_status`` (``gpufleet serve``
answers with it). Callers map by those attributes, never by the class, so a new kind of error is
one class here. A class without its own status answers 400.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


class GpufleetError(Exception):
    """Base of every error gpufleet raises on purpose; its two attributes say how it ends."""

    exit_code: int = 2
    """The CLI's exit status: 2 bad input, 1 a check that ran and failed, 3 a service that does not answer."""
    http_status: int = 400
    """The API's answer: 400 bad input unless a subclass knows better (404, 409, 422, 503, 504)."""


class SpecError(GpufleetError):
    """A JobSpec that does not validate; the message names the field."""


class UsageError(GpufleetError):
    """A bad command-line value, an unreadable path: the same command with another value works.

    :class:`NotFound` and :class:`Conflict` are kinds of it, so code that refuses any user error
    (``except UsageError``) still catches them; they differ only in the status the API answers.
    """


class ParameterError(UsageError):
    """A bad argument of a library function: the message names the function's parameters (``gpus=0``).

    ``template`` is a :meth:`str.format` string over ``values``: ``{gpus}`` shows a parameter and its
    value (a string quoted), ``{gpus:name}`` its name alone, ``{gpus!r}`` or ``{gpus!s}`` its value
    alone. A command line that took the values as flags says the same with :meth:`as_flags`
    (``--gpus 0``), so each caller reads the names it typed. The API answers 422, as it does for a
    value its own validation refuses.
    """

    http_status = 422

    def __init__(self, template: str, /, **values: object) -> None:
        super().__init__(template)
        self.template = template
        self.values = values

    def __str__(self) -> str:
        return self._render({})

    def as_flags(self, flags: Mapping[str, str]) -> UsageError:
        """The same error in command-line words: each parameter in ``flags`` (``{"gpus": "--gpus"}``) by its flag."""
        return UsageError(self._render(flags))

    def _render(self, flags: Mapping[str, str]) -> str:
        return self.template.format_map({k: _Shown(k, v, flags.get(k)) for k, v in self.values.items()})


class NotFound(UsageError):
    """Something a user named by its id or name (a job, an attempt, a model, a version, a sweep) does not exist.

    A :class:`UsageError` (exit 2): the same command with an id that exists works. The API answers 404.
    """

    http_status = 404


class Conflict(UsageError):
    """The thing named exists but its state refuses the request: a job not queued, already over, held or running.

    A :class:`UsageError` (exit 2): nothing was changed, and the same command works once the state
    allows it. The API answers 409.
    """

    http_status = 409


class _Shown:
    """One value of a :class:`ParameterError` as a format field: ``gpus=0``, or ``--gpus 0`` under a flag."""

    __slots__ = ("flag", "name", "value")

    def __init__(self, name: str, value: object, flag: str | None) -> None:
        self.name, self.value, self.flag = name, value, flag

    def __format__(self, spec: str) -> str:
        label = self.name if self.flag is None else self.flag
        if spec == "name":
            return label
        if spec:
            raise ValueError(f"format spec {spec!r} of {self.name!r}: use none or 'name'")
        value = repr(self.value) if isinstance(self.value, str) else str(self.value)
        return f"{label}{'=' if self.flag is None else ' '}{value}"

    def __repr__(self) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return str(self.value)


@contextmanager
def parameters_as_flags(flags: Mapping[str, str]) -> Iterator[None]:
    """Re-raise a :class:`ParameterError` in command-line words (:meth:`ParameterError.as_flags`).

    A context manager, or a decorator of a command: ``@parameters_as_flags({"gpus": "--gpus"})``.
    """
    try:
        yield
    except ParameterError as err:
        raise err.as_flags(flags) from None


class CheckpointError(GpufleetError):
    """No restorable checkpoint where one was required."""

    exit_code = 1


class CorruptCheckpoint(CheckpointError):
    """A checkpoint folder whose manifest or files do not verify."""


class ForeignCheckpoint(CheckpointError):
    """A checkpoint that verifies but is not this job's: another job wrote it, or it lacks an object."""


class CheckpointSpaceError(CheckpointError):
    """A save that ran out of disk space; its partial folder is removed, earlier checkpoints are kept.

    ``needed`` is the exact serialized size of the state, ``free`` what the filesystem of ``path``
    has left, so a caller can decide between waiting, pruning and moving elsewhere.
    """

    def __init__(self, message: str, *, path: Path, needed: int, free: int) -> None:
        super().__init__(message)
        self.path = path
        self.needed = needed
        self.free = free


class HealthError(GpufleetError):
    """Training produced unhealthy steps more often than the health policy allows."""

    exit_code = 1


class StoreError(GpufleetError):
    """The state database cannot be used."""


class ServiceUnavailable(GpufleetError):
    """A service a command needs (Slurm, Ray, an MLflow server, a trace collector) does not answer.

    Not bad input: the same command works once the service is up, so it exits 3 (the contract in
    docs/getting-started.md) and the message says how to start it or where it was looked for. The API answers 503.
    """

    exit_code = 3
    http_status = 503


class Timeout(ServiceUnavailable):
    """Something waited for (a Ray actor's answer, a wait bounded by a timeout) did not happen in time.

    A kind of :class:`ServiceUnavailable`: what did not answer is a service or runs on one, the same
    command may work when tried again, and every caller that rides out an unreachable service rides
    out a slow one too. It exits 3 like one; the API answers 504 (it waited, then gave up).
    """

    http_status = 504


__all__ = [
    "CheckpointError",
    "CheckpointSpaceError",
    "Conflict",
    "CorruptCheckpoint",
    "ForeignCheckpoint",
    "GpufleetError",
    "HealthError",
    "NotFound",
    "ParameterError",
    "ServiceUnavailable",
    "SpecError",
    "StoreError",
    "Timeout",
    "UsageError",
    "parameters_as_flags",
]
