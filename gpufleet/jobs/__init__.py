"""What every part of gpufleet agrees on about a job once it is submitted.

``store`` is the SQLite state (jobs, attempts, events, requests) the CLI and the backends share;
``events`` is the JSONL log a training process writes and the names of its events; ``protocol``
is the contract between a backend and the process it starts (environment variables, exit codes).

Floor 3 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/.
"""

__all__: list[str] = []
