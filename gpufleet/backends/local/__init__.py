"""The embedded local backend: virtual GPU slots on this host, priority preemption with requeue.

What lives here, and what each module may import of the others (no module imports a private
name of another, and nothing imports in a circle):

- ``process.py``: the scheduler as a process (slots, lock and PID, the settings it started with,
  :func:`ensure_scheduler`). Imports none of the others.
- ``scheduler.py``: :class:`LocalScheduler`, the loop that owns the attempts (launch, signal, reap,
  requeue, adopt what a dead scheduler left) and places jobs in one pool of slots. It declares
  :class:`FleetPolicy`, what it asks of the placement on a fleet. Imports ``process`` and ``warm``.
- ``warm.py``: the handle on the warm spawn server (:class:`WarmServer`, and :class:`WarmProcess`, an
  attempt's handle with ``Popen``'s surface) and the rules both halves share. Imports none of the others.
- ``warm_server.py``: the server process that forks attempts from an interpreter that has imported
  torch. Imports ``warm``.
- ``fleet.py``: :class:`FleetScheduling`, that policy (quotas, reclaim, storms, failover, checkpoint
  moves), which plugs itself into the loop when imported. Imports ``scheduler``.
- ``backend.py``: :class:`LocalBackend`, the client side (``gpufleet submit`` and the job verbs)
  that writes the store and wakes the scheduler. Imports ``process``.
- ``__main__.py``: ``python -m gpufleet.backends.local [--detach] GPUFLEET_HOME``, the scheduler
  process ``ensure_scheduler`` starts.

The fleet's files and the placing the local and Slurm backends share live one level up, in
``backends/pools.py``; all of them may import it. This ``__init__`` imports ``fleet.py``, so a
scheduler, however it is imported, always has its fleet policy.
"""

from __future__ import annotations

from gpufleet.backends.local.backend import LocalBackend
from gpufleet.backends.local.fleet import REPLAN_S, FleetScheduling
from gpufleet.backends.local.process import (
    DEFAULT_SLOTS,
    SETTINGS_PREFIXES,
    configured_slots,
    ensure_scheduler,
    environment_digests,
    record_settings,
    running_settings,
    scheduler_pid,
    scheduler_slots,
    settings_drift,
    settings_file,
    slots_of,
    store_for,
)
from gpufleet.backends.local.scheduler import (
    FleetLoader,
    FleetPolicy,
    LocalScheduler,
    RunningAttempt,
    main,
    plug_fleet_policy,
    startable,
)

__all__ = [
    "DEFAULT_SLOTS",
    "REPLAN_S",
    "SETTINGS_PREFIXES",
    "FleetLoader",
    "FleetPolicy",
    "FleetScheduling",
    "LocalBackend",
    "LocalScheduler",
    "RunningAttempt",
    "configured_slots",
    "ensure_scheduler",
    "environment_digests",
    "main",
    "plug_fleet_policy",
    "record_settings",
    "running_settings",
    "scheduler_pid",
    "scheduler_slots",
    "settings_drift",
    "settings_file",
    "slots_of",
    "startable",
    "store_for",
]
