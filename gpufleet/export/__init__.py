"""A JobSpec handed to another scheduler in that scheduler's own files.

``skypilot`` writes a SkyPilot task (``sky jobs launch``: SkyPilot finds capacity across clouds
and recovers preempted attempts); ``kueue`` writes Kueue manifests for a Kubernetes cluster
(flavors, cohorts and team queues from the catalogue's quotas, and the job as a suspended
``batch/v1`` Job). Both keep the runtime contract (``GPUFLEET_*``, exit code 75 means "saved,
requeue me", a grace period long enough to save) so a preempted attempt resumes where it saved.
Pure functions: they return mappings; the CLI writes the YAML.

Floor 11 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/, data/, rl/,
workloads/, devtools/, placement/, backends/.
"""

from __future__ import annotations

from gpufleet.export.kueue import kueue_manifests, kueue_problems, kueue_yaml
from gpufleet.export.skypilot import skypilot_task, skypilot_yaml

__all__ = ["kueue_manifests", "kueue_problems", "kueue_yaml", "skypilot_task", "skypilot_yaml"]
