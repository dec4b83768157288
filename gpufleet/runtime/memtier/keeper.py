"""The keeper: a process that holds the newest copies of each rank in its own RAM, over TCP.

    python -m gpufleet.runtime.memtier.keeper [--address 127.0.0.1:0] [--ready-file F]
        [--idle-seconds 900] [--max-copy-bytes N] [--max-bytes N]

It outlives the ranks it serves (started detached, in a session of its own), so a rank that dies
leaves its state here for its replacement; on a fleet a rank points at another node's keeper
(``GPUFLEET_MEMORY_PEER``), so a lost node loses no copy either. It keeps the 2 newest steps per
(job key, rank), refuses a copy larger than ``--max-copy-bytes`` before reading it and one that
would take it over ``--max-bytes``, and exits by itself after ``--idle-seconds`` without a request.
It never interprets a payload; headers are JSON (``wire.py``). The job's own keeper runs on the
ranks' node and takes a copy by its file (``PUT_FILE``): it reads the rank's file in shared memory
itself, so a rank spends no time on the send; it reads only a file at the exact place a rank's copy
of that step has under its own private root (``shm.py``), never a path a client makes up. It runs
at a lower priority (``NICE``): on a node whose cores the ranks keep busy, receiving a copy waits
for an idle core rather than slow a step down (a rank skips its next send while one is in flight).

It serves only clients that know its secret, ``GPUFLEET_MEMORY_PEER_TOKEN`` in its environment
(never an argument: any user of the node can read a process's command line), and refuses to start
without one of at least 32 characters. ``ensure_keeper`` makes a fresh one for each keeper it starts;
a keeper started by hand on another node gets one from its operator, and the ranks that name it in
``GPUFLEET_MEMORY_PEER`` get the same in ``GPUFLEET_MEMORY_PEER_TOKEN``. The secret travels in each
request's header, not as an HMAC of the frame: hashing every payload (gigabytes of weights) would
cost a pass over each copy, and on a network without encryption whoever could read the secret on the
wire could read the weights too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import socketserver
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpufleet.runtime.memtier.copies import CopyHeader, TierError
from gpufleet.runtime.memtier.shm import OwnStore, private_root, shm_root
from gpufleet.runtime.memtier.wire import FILE_REFUSED, Closed, Op, WireError, recv_frame, send_frame

KEEP = 2
NICE = 10
"""How much the keeper lowers its own scheduling priority (``os.nice``)."""
IDLE_SECONDS = 15 * 60.0
KEY = re.compile(r"[0-9a-f]{1,64}")
RUN = re.compile(r"[0-9a-f]{1,64}")
ENV_TOKEN = "GPUFLEET_MEMORY_PEER_TOKEN"
"""The keeper's secret, in its environment; the same variable gives the ranks a peer keeper's secret."""
MIN_SECRET_CHARS = 32
Reply = tuple[Op, dict[str, Any], bytes | bytearray]


def _mem_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 34


class Keeper:
    """The copies held, by (key, rank): newest last, at most ``KEEP``; the request handling, without sockets."""

    def __init__(self, max_copy_bytes: int, max_bytes: int, shm: Path | None = None) -> None:
        self.max_copy_bytes, self.max_bytes = max_copy_bytes, max_bytes
        self.shm = shm
        """The node's shared-memory root whose copies ``PUT_FILE`` may name (``None``: refused)."""
        self.copies: dict[tuple[str, int], list[tuple[CopyHeader, bytes | bytearray]]] = {}
        self.lock = threading.Lock()
        self.last_request = time.monotonic()

    def held_bytes(self) -> int:
        return sum(len(p) for held in self.copies.values() for _, p in held)

    def handle(self, op: Op, header: dict[str, Any], payload: bytearray) -> Reply:
        self.last_request = time.monotonic()
        if op is Op.PING:
            return Op.OK, {"pid": os.getpid()}, b""
        key = header.get("key")
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise WireError("key must be 1 to 64 lowercase hex digits")
        rank = header.get("rank")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= 99_999):
            raise WireError("rank must be an integer from 0 to 99999")
        if op is Op.PUT_FILE:
            payload = self._read_copy(key, rank, header)  # outside the lock: other ranks' requests go on
        with self.lock:
            if op in (Op.PUT, Op.PUT_FILE):
                return self._put(key, rank, header, payload)
            if op is Op.GET:
                return self._get(key, rank, header.get("step"))
            if op is Op.LIST:
                listed = [
                    {"rank": r, "step": h.step, "bytes": h.bytes, "run": h.run}
                    for (k, r), held in self.copies.items()
                    if k == key
                    for h, _ in held
                ]
                return Op.OK, {"copies": listed}, b""
            if op is Op.DROP:
                return self._drop(key, rank, header.get("after_step"), header.get("other_than_run"))
        raise WireError(f"operation {op.name} is not a request")

    def _put(self, key: str, rank: int | None, header: dict[str, Any], payload: bytearray) -> Reply:
        if rank is None:
            raise WireError("PUT needs a rank")
        copy = CopyHeader.from_dict(header.get("copy"))
        if copy.bytes != len(payload):
            raise WireError(f"PUT of {len(payload)} bytes, its header says {copy.bytes}")
        held = [(h, p) for h, p in self.copies.get((key, rank), []) if h.step != copy.step]
        dropped = held[: max(0, len(held) - (KEEP - 1))]
        if self.held_bytes() - sum(len(p) for _, p in dropped) + len(payload) > self.max_bytes:
            raise WireError(f"keeper is full: {self.held_bytes()} bytes held, limit {self.max_bytes}")
        held = [*held[len(dropped) :], (copy, payload)]
        self.copies[(key, rank)] = sorted(held, key=lambda item: item[0].step)
        return Op.OK, {"step": copy.step}, b""

    def _read_copy(self, key: str, rank: int | None, header: dict[str, Any]) -> bytearray:
        """The bytes of the rank's own copy that ``PUT_FILE`` names, read from its file in shared memory."""
        if rank is None or self.shm is None:
            raise WireError(f"{FILE_REFUSED}: this keeper takes copies as bytes only")
        copy = CopyHeader.from_dict(header.get("copy"))
        if copy.bytes > self.max_copy_bytes:
            raise WireError(f"copy of {copy.bytes} bytes is larger than the limit of {self.max_copy_bytes}")
        path = OwnStore(self.shm, key, rank).path(copy.step)
        if header.get("path") != str(path) or not private_root(self.shm):
            raise WireError(f"{FILE_REFUSED}: it is not that rank's copy under this keeper's private root")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as err:
            raise WireError(f"the copy's file does not open: {err.strerror}") from None
        with os.fdopen(fd, "rb", buffering=0) as fh:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != copy.bytes:
                raise WireError(f"the copy's file is not a regular file of {copy.bytes} bytes")
            payload, got = bytearray(copy.bytes), 0
            with memoryview(payload) as view:
                while got < copy.bytes:
                    n = fh.readinto(view[got:])
                    if not n:
                        raise WireError("the copy's file got shorter while it was read")
                    got += n
        return payload

    def _get(self, key: str, rank: int | None, step: Any) -> Reply:
        held = self.copies.get((key, rank if rank is not None else 0), [])
        found = [item for item in held if step is None or item[0].step == step]
        if not found:
            return Op.ERR, {"error": "missing"}, b""
        copy, payload = found[-1]
        return Op.OK, {"copy": copy.to_dict()}, payload

    def _drop(self, key: str, rank: int | None, after: Any, other_than_run: Any = None) -> Reply:
        """The copies of ``key`` (one rank's, or all): after a step, of a run other than one, or every one."""
        if other_than_run is not None and not (isinstance(other_than_run, str) and RUN.fullmatch(other_than_run)):
            raise WireError("other_than_run must be 1 to 64 lowercase hex digits")
        for where in [k for k in self.copies if k[0] == key and (rank is None or k[1] == rank)]:
            if other_than_run is not None:
                self.copies[where] = [item for item in self.copies[where] if item[0].run in (None, other_than_run)]
            elif isinstance(after, int) and not isinstance(after, bool):
                self.copies[where] = [item for item in self.copies[where] if item[0].step <= after]
            else:
                del self.copies[where]
        return Op.OK, {}, b""


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        keeper = self.server.keeper
        while True:
            try:
                op, header, payload = recv_frame(sock, keeper.max_copy_bytes, secret=self.server.secret)
                reply = keeper.handle(op, header, payload)
            except Closed:
                return
            except TierError as err:  # a frame we refuse: say why, then hang up (the stream is out of step)
                keeper.last_request = time.monotonic()
                with contextlib.suppress(OSError):
                    send_frame(sock, Op.ERR, {"error": str(err)[:500]})
                return
            except OSError:
                return
            try:
                send_frame(sock, reply[0], reply[1], reply[2])
            except OSError:
                return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], keeper: Keeper, secret: str) -> None:
        self.keeper, self.secret = keeper, secret
        super().__init__(address, _Handler)


def parse_address(raw: str) -> tuple[str, int]:
    """``host:port`` (a port of 0 picks a free one); ``TierError`` names the value and the form."""
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise TierError(f"keeper address {raw!r} is not host:port, e.g. 127.0.0.1:7070")
    return host.strip("[]"), int(port)


def serve(
    address: str, *, secret: str, idle_seconds: float, max_copy_bytes: int, max_bytes: int, ready: Path | None
) -> None:
    """Listen on ``address`` and serve the clients that send ``secret`` until idle for ``idle_seconds``."""
    if len(secret) < MIN_SECRET_CHARS:
        raise TierError(f"the keeper's secret has {len(secret)} characters; give it at least {MIN_SECRET_CHARS}")
    keeper = Keeper(max_copy_bytes, max_bytes, shm_root(os.environ))
    server = _Server(parse_address(address), keeper, secret)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    if ready is not None:
        tmp = ready.with_name(f".{ready.name}.tmp")
        tmp.write_text(f"{host}:{port}\n", encoding="utf-8")
        os.replace(tmp, ready)

    def watch_idle() -> None:
        while time.monotonic() - keeper.last_request < idle_seconds:
            time.sleep(min(1.0, idle_seconds / 4))
        server.shutdown()

    threading.Thread(target=watch_idle, daemon=True, name="keeper-idle").start()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gpufleet.runtime.memtier.keeper",
        description="Hold the newest memory copies of each rank of a job, over TCP.",
    )
    p.add_argument("--address", default="127.0.0.1:0", help="host:port to listen on (port 0: any free one)")
    p.add_argument("--ready-file", type=Path, default=None, help="write the bound host:port here once listening")
    p.add_argument("--idle-seconds", type=float, default=IDLE_SECONDS, help="exit after this long without a request")
    p.add_argument("--max-copy-bytes", type=int, default=None, help="largest copy accepted (default: --max-bytes)")
    p.add_argument("--max-bytes", type=int, default=None, help="most bytes held (default: 80%% of MemAvailable)")
    args = p.parse_args(argv)
    max_bytes = args.max_bytes if args.max_bytes is not None else int(_mem_available() * 0.8)
    if max_bytes < 1 or args.idle_seconds <= 0:
        p.error("--max-bytes and --idle-seconds must be positive")
    max_copy = args.max_copy_bytes if args.max_copy_bytes is not None else max_bytes
    secret = os.environ.get(ENV_TOKEN, "").strip()
    if len(secret) < MIN_SECRET_CHARS:  # one line, as every refusal of bad input
        print(
            f"keeper: {ENV_TOKEN} is {'unset' if not secret else 'too short'}: set it in the keeper's environment "
            f"to a secret of at least {MIN_SECRET_CHARS} characters (python -c 'import secrets; "
            "print(secrets.token_hex(32))')",
            file=sys.stderr,
            flush=True,
        )
        return 2
    with contextlib.suppress(OSError):
        os.nice(NICE)
    try:
        serve(
            args.address,
            secret=secret,
            idle_seconds=args.idle_seconds,
            max_copy_bytes=max_copy,
            max_bytes=max_bytes,
            ready=args.ready_file,
        )
    except TierError as err:
        p.error(str(err))
    except OSError as err:
        print(f"keeper: cannot listen on {args.address}: {err.strerror}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

__all__ = ["ENV_TOKEN", "Keeper", "main", "parse_address", "serve"]
