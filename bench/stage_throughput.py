"""Stage-in throughput against the two paths it is bound by, from a local S3 server to scratch.

    .venv/bin/python bench/stage_throughput.py [--json] [--gib 2] [--files 256] [--rounds 3] [--workers 8] [--dir PATH]

A moto S3 server (its server mode, a separate process on 127.0.0.1) holds ``--gib`` GiB of random
bytes in ``--files`` objects. Each round, interleaved, measures on the same disk:

- source read: every object read through s3fs with ``--workers`` readers, bytes dropped;
- stage: ``gpufleet.data`` staging the bucket cold into a fresh folder under ``--dir`` (one
  ``GetObject`` per object, its bytes hashed against the object's own checksum, temporary file,
  fsync, rename, manifest);
- disk: fio's sequential write (1 MiB blocks, direct I/O where the file system takes it) in ``--dir``.

Target (the data-path issue): the median staging rate at least 0.8 of the slower of the medians of
the other two. The table also gives the CPU-seconds per GiB each path cost this process (the client)
and the server: on a machine of two cores where the server shares the CPU, every CPU-second the
client spends per GiB is taken from the server, and the rates say so. The source read pays for one
CRC32 too: botocore checks a whole-object read against the object's checksum (these objects are one
read block each), as staging does once with its own hash.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _common as common

TARGET = 0.8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the moto S3 server did not start") from None
            time.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: Sequence[str]) -> int:
    p = common.parser(__doc__.splitlines()[0] if __doc__ else "stage throughput")
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--files", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--dir", type=Path, default=None, help="folder on the disk to stage into (default: a temp folder)")
    p.add_argument("--disk-runtime", type=float, default=5.0)
    args = p.parse_args(argv)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    import boto3

    from gpufleet.data.bench import read_rate, stage_cold
    from gpufleet.iobench import measure_disk
    from gpufleet.spec import parse_spec

    size = int(args.gib * (1 << 30)) // args.files
    server, endpoint = start_server()
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bench")
        common.progress(f"uploading {args.files} objects of {size / 2**20:.1f} MiB to {endpoint}")
        block = os.urandom(size)

        def put(i: int) -> None:
            body = i.to_bytes(8, "little") + block[8:]  # distinct objects, distinct ETags
            client.put_object(Bucket="bench", Key=f"shards/shard-{i:05d}.bin", Body=body)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, range(args.files)))
        spec = parse_spec(
            {
                "name": "bench",
                "entrypoint": "m:f",
                "data": {
                    "sources": [{"source": "s3://bench/shards", "dest": "shards", "endpoint_url": endpoint}],
                    "workers": args.workers,
                },
            }
        )
        assert spec.data is not None
        rates: dict[str, list[float]] = {"source read": [], "stage": [], "disk write": []}
        cpu: dict[str, list[tuple[float, float]]] = {"source read": [], "stage": []}
        gib = size * args.files / (1 << 30)

        def metered(path: str, fn: Any) -> Any:
            client, server_cpu = time.process_time(), cpu_seconds(server.pid)
            out = fn()
            cpu[path].append(((time.process_time() - client) / gib, (cpu_seconds(server.pid) - server_cpu) / gib))
            return out

        with tempfile.TemporaryDirectory(prefix="gpufleet-bench-stage-", dir=args.dir) as tmp:
            folder = Path(tmp)
            fs = common.filesystem_of(folder)
            for r in range(args.rounds):
                rates["source read"].append(metered("source read", lambda: read_rate(spec.data)))
                report = metered("stage", lambda: stage_cold(spec.data, folder))
                assert report.files_copied == args.files, report.to_json()
                rates["stage"].append(report.bytes_copied / report.seconds)
                disk = measure_disk(folder, size_bytes=1 << 30, runtime_s=args.disk_runtime, which=("seqwrite",))
                rates["disk write"].append(disk.seq_write_bytes_per_s or 0.0)
                common.progress(
                    f"round {r + 1}/{args.rounds}: "
                    + ", ".join(f"{k} {v[-1] / 1e6:,.0f} MB/s" for k, v in rates.items())
                    + f" ({disk.mode})"
                )
    finally:
        server.terminate()
        server.wait(30)
    med = {k: common.median(v) for k, v in rates.items()}
    slower = min(("source read", "disk write"), key=lambda k: med[k])
    ratio = common.ratio(med["stage"], med[slower])
    cpu_med = {k: (common.median([c for c, _ in v]), common.median([sv for _, sv in v])) for k, v in cpu.items()}
    rows = [
        [
            k,
            f"{med[k] / 1e6:,.0f}",
            " ".join(f"{x / 1e6:,.0f}" for x in rates[k]),
            f"{cpu_med[k][0]:.2f}" if k in cpu_med else "",
            f"{cpu_med[k][1]:.2f}" if k in cpu_med else "",
        ]
        for k in rates
    ]
    title = (
        f"stage-in of {args.gib:g} GiB in {args.files} files from a local S3 server (moto) to {fs.describe()}, "
        f"{args.workers} workers, {args.rounds} interleaved rounds (medians)"
    )
    result = {
        "gib": args.gib,
        "files": args.files,
        "workers": args.workers,
        "rounds": args.rounds,
        "bytes_per_s": med,
        "cpu_seconds_per_gib": {k: {"client": c, "server": sv} for k, (c, sv) in cpu_med.items()},
        "rounds_bytes_per_s": rates,
        "slower_path": slower,
        "ratio": ratio,
        "filesystem": fs.describe(),
    }
    verdict = f"staging ran at {ratio:.2f} of the slower path ({slower}); target >= {TARGET:g}"
    return common.finish(
        json_mode=args.json,
        result=result,
        table=common.format_table(
            title, ["path", "MB/s (median)", "rounds", "client CPU-s/GiB", "server CPU-s/GiB"], rows
        ),
        verdict=verdict,
        ok=ratio >= TARGET,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
