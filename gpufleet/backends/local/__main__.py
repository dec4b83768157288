"""``python -m gpufleet.backends.local [--detach] GPUFLEET_HOME``: the scheduler process of one home."""

from __future__ import annotations

import sys

from gpufleet.backends.local.scheduler import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
