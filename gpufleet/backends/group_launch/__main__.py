"""``python -m gpufleet.backends.group_launch``: run one attempt's ranks under torchrun (see the package)."""

from __future__ import annotations

import sys

from gpufleet.backends.group_launch import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
