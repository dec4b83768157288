"""Slurm: ``backend`` submits and follows jobs with sbatch/squeue/sacct/scontrol, ``rank`` runs one
task of a multi-rank job under srun, and ``topology`` reads hostlists and writes topology.conf."""
