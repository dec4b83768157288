"""The memory tier of checkpoints: copies of every rank's state in RAM that outlive the rank.

Floor 6 of the layers (the Layout in docs/architecture.md), like the rest of ``runtime``.

::

    copies.py   CopyHeader, encode/decode   one copy: a JSON header (step, a CRC-32 per 64 MiB chunk named by
                                            its algorithm, fingerprint, bytes, created-at, judged) and its body
    flat.py     (the body)                  every tensor's bytes in one buffer filled by one ``_foreach_copy_``,
                                            and a tagged JSON index of the rest; read back as views of a mapping
    shm.py      OwnStore                    the node's own copies: ``/dev/shm/gpufleet-<uid>/<key>/rank-R``,
                                            written from the staged buffer, read back mapped
    wire.py     (frames)                    the keeper's length-prefixed protocol: JSON headers, opaque bytes
    keeper.py   Keeper, ``python -m``       a process that holds the newest copies of each rank in its RAM
    peer.py     PeerClient, ensure_keeper   talking to a keeper; starting the job's own one, once
    runid.py    run_id                      the run a job folder belongs to: copies of an earlier run are skipped
    tier.py     RamTier                     snapshot at a step boundary, restore own -> peer, agreed by ranks
    release.py  release, tier_need_bytes    what a finished job leaves behind, and what a tier needs

Why a second tier: a disk checkpoint every step costs seconds; a copy into RAM costs a clone,
and the write that follows runs in a background thread. A rank that dies leaves its shared-memory
files and the keeper's copy behind, so its replacement starts from the step it died at, not the
last disk checkpoint. Nothing here is trusted: every copy is hashed, its header is checked against
the run (run id, fingerprint, job, world size) and a bad one is skipped, never loaded; a keeper
serves only the clients that send its secret.

Nothing in this package imports torch at import time (the CLI lists the tiers without it).
"""

from __future__ import annotations

from gpufleet.runtime.memtier.release import release, tier_need_bytes

__all__ = ["release", "tier_need_bytes"]
