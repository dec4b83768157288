"""The contract between a backend and the training process it starts (no torch import here).

The backend exports these variables to every attempt; ``TrainSession.from_env`` reads them.
"""

from __future__ import annotations

REQUEUE_EXIT_CODE = 75
"""Exit status of an attempt that saved its state and asks to be requeued (EX_TEMPFAIL)."""

ENV_JOB_ID = "GPUFLEET_JOB_ID"
ENV_ATTEMPT = "GPUFLEET_ATTEMPT"
ENV_JOB_DIR = "GPUFLEET_JOB_DIR"
ENV_SPEC = "GPUFLEET_SPEC"
ENV_CKPT_DIR = "GPUFLEET_CKPT_DIR"
ENV_EVENTS = "GPUFLEET_EVENTS"
ENV_FAULT = "GPUFLEET_FAULT"
ENV_LOG_EVERY_S = "GPUFLEET_LOG_EVERY_S"
