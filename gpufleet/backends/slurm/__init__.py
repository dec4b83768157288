"""Slurm: ``backend`` submits and follows jobs with sbatch/squeue/sacct/scontrol, ``rank`` runs one
task of a multi-rank job under srun, ``hostlist`` expands and folds Slurm hostlists, and
``topology`` models the fleet's switches and writes topology.conf."""

__all__: list[str] = []
