"""Talking to a keeper, and starting the job's own one when no peer is given.

``GPUFLEET_MEMORY_PEER=host:port`` points a rank at another node's keeper (a fleet). Without it,
the first rank that needs a keeper starts one for the job, detached from itself (a session of its
own, no death signal: it must outlive the rank), and records it in
``$GPUFLEET_JOB_DIR/memory-keeper.json``; the record is read and written under an ``flock``, so
two ranks starting at once start one keeper, and later ranks and attempts reuse it once its pid is
alive and it answers.

A keeper serves only clients that send its secret (``keeper.py``). ``ensure_keeper`` makes a new
one (``secrets.token_hex(32)``) for each keeper it starts, hands it over in the keeper's environment
(never its command line, which any user of the node can read) and keeps it in the record, written
with mode 0600 in a job folder it makes private. A keeper named by ``GPUFLEET_MEMORY_PEER`` takes its
secret from ``GPUFLEET_MEMORY_PEER_TOKEN``. A ``PeerClient`` made without a token uses the secret of
the keeper at that address that ``running_keeper`` or ``ensure_keeper`` found in this process.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpufleet.runtime.memtier.copies import CopyHeader, TierError
from gpufleet.runtime.memtier.keeper import ENV_TOKEN, MIN_SECRET_CHARS, parse_address
from gpufleet.runtime.memtier.wire import TOKEN, Op, WireError, recv_frame, send_file_frame, send_frame

ENV_PEER = "GPUFLEET_MEMORY_PEER"
RECORD = "memory-keeper.json"
KEEPER_MODULE = "gpufleet.runtime.memtier.keeper"
MAX_REPLY_BYTES = 1 << 40
SECRET = re.compile(r"[\x21-\x7e]{32,256}")
"""A keeper's secret as a record or ``GPUFLEET_MEMORY_PEER_TOKEN`` may hold it (printable, no spaces)."""
_secrets: dict[str, str] = {}
"""Address -> secret of the job keepers this process found (``running_keeper``, ``ensure_keeper``)."""
_secrets_lock = threading.Lock()


def _remember(address: str, secret: str) -> None:
    with _secrets_lock:
        _secrets[address] = secret


def known_secret(address: str) -> str | None:
    """The secret of the keeper at ``address`` when this process found it through its record."""
    with _secrets_lock:
        return _secrets.get(address)


class PeerClient:
    """One connection to a keeper; any failure closes it and raises ``TierError`` (the caller retries later)."""

    def __init__(self, address: str, timeout: float = 60.0, *, token: str | None = None) -> None:
        self.address = address
        self.host, self.port = parse_address(address)
        self.timeout = timeout
        self._token = token if token is not None else known_secret(address)
        self._sock: socket.socket | None = None

    def __repr__(self) -> str:  # never the secret
        return f"PeerClient({self.address!r})"

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def _call(
        self, op: Op, header: dict[str, Any], payload: bytes | memoryview = b"", *, file: tuple[int, int] | None = None
    ) -> tuple[dict[str, Any], bytearray]:
        """One request and its reply; ``file``: the payload is ``(fd, nbytes)``, sent from the file by the kernel."""
        try:
            if self._sock is None:
                self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            signed = {**header, TOKEN: self._token} if self._token is not None else header
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a refusal hangs up: read why
                if file is not None:
                    send_file_frame(self._sock, op, signed, *file)
                else:
                    send_frame(self._sock, op, signed, payload)
            reply, got, data = recv_frame(self._sock, MAX_REPLY_BYTES)
        except (OSError, WireError) as err:
            self.close()
            raise TierError(f"keeper at {self.address} is unreachable ({err})") from None
        if reply is Op.ERR:
            error = str(got.get("error", "refused"))
            if error != "missing":
                self.close()  # the keeper hangs up after refusing a frame
            raise TierError(error)
        return got, data

    def ping(self) -> int:
        pid = self._call(Op.PING, {})[0].get("pid")
        return pid if isinstance(pid, int) else -1

    def put(self, key: str, rank: int, header: CopyHeader, payload: bytes | memoryview) -> None:
        self._call(Op.PUT, {"key": key, "rank": rank, "copy": header.to_dict()}, payload)

    def put_file(self, key: str, rank: int, header: CopyHeader, fd: int) -> None:
        """``put`` of a copy whose bytes are the first ``header.bytes`` of the open file ``fd``."""
        self._call(Op.PUT, {"key": key, "rank": rank, "copy": header.to_dict()}, file=(fd, header.bytes))

    def put_path(self, key: str, rank: int, header: CopyHeader, path: str) -> None:
        """``put`` of the rank's own copy by its file: the job's keeper, on this node, reads it."""
        self._call(Op.PUT_FILE, {"key": key, "rank": rank, "copy": header.to_dict(), "path": path})

    def get(self, key: str, rank: int, step: int | None = None) -> tuple[CopyHeader, bytearray] | None:
        try:
            got, data = self._call(Op.GET, {"key": key, "rank": rank, **({"step": step} if step is not None else {})})
        except TierError as err:
            if str(err) == "missing":
                return None
            raise
        return CopyHeader.from_dict(got.get("copy")), data

    def list(self, key: str) -> list[tuple[int, int]]:
        """``(rank, step)`` of every copy of the job the keeper holds."""
        return [(rank, step) for rank, step, _ in self.copies(key)]

    def copies(self, key: str) -> builtins.list[tuple[int, int, str | None]]:
        """``(rank, step, run)`` of every copy of the job the keeper holds (``run``: ``None`` when unknown)."""
        copies = self._call(Op.LIST, {"key": key})[0].get("copies")
        out: builtins.list[tuple[int, int, str | None]] = []
        for item in copies if isinstance(copies, list) else []:
            if not isinstance(item, dict):
                continue
            rank, step, run = item.get("rank"), item.get("step"), item.get("run")
            if isinstance(rank, int) and isinstance(step, int):
                out.append((rank, step, run if isinstance(run, str) else None))
        return out

    def drop(
        self, key: str, rank: int | None = None, after_step: int | None = None, *, other_than_run: str | None = None
    ) -> None:
        """Drop copies of ``key``: one rank's or all, those after a step, those of runs other than one, or all."""
        header: dict[str, Any] = {"key": key}
        if rank is not None:
            header["rank"] = rank
        if after_step is not None:
            header["after_step"] = after_step
        if other_than_run is not None:
            header["other_than_run"] = other_than_run
        self._call(Op.DROP, header)


def read_record(job_dir: Path) -> dict[str, Any] | None:
    """The job's keeper record (``{"pid", "address", "token"}``), or ``None`` when absent or not one.

    A record without a valid ``token`` (a keeper started before keepers had secrets) is still
    returned, so ``release`` can stop its keeper; ``running_keeper`` does not use it.
    """
    try:
        raw = json.loads((job_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("pid"), int) or not isinstance(raw.get("address"), str):
        return None
    return raw


def is_keeper(pid: int) -> bool:
    """Whether ``pid`` is alive and runs our keeper (its command line names the module): never signal another."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return KEEPER_MODULE.encode() in cmdline


def answering(address: str, pid: int | None = None, timeout: float = 5.0, *, token: str | None = None) -> bool:
    client = PeerClient(address, timeout=timeout, token=token)
    try:
        got = client.ping()
    except TierError:
        return False
    finally:
        client.close()
    return pid is None or got == pid


def running_keeper(job_dir: Path) -> str | None:
    """The address of the job's recorded keeper when it is alive and answers, else ``None``."""
    record = read_record(job_dir)
    token = record.get("token") if record is not None else None
    if record is None or not isinstance(token, str) or not SECRET.fullmatch(token) or not is_keeper(record["pid"]):
        return None
    if not answering(record["address"], record["pid"], token=token):
        return None
    _remember(record["address"], token)
    return str(record["address"])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure_keeper(job_dir: Path, *, start_timeout: float = 60.0) -> str:
    """The address of the job's keeper, started (detached) when none is alive; under an flock.

    The job folder is made private (0700) when this makes it; the record is 0600 whatever the folder.
    """
    job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _locked(job_dir / ".memory-keeper.lock"):
        address = running_keeper(job_dir)
        if address is not None:
            return address
        ready = job_dir / f".memory-keeper-ready-{os.getpid()}"
        ready.unlink(missing_ok=True)
        secret = secrets.token_hex(32)
        pid, exited = _spawn_detached(job_dir / "memory-keeper.log", ready, secret=secret)
        deadline = time.monotonic() + start_timeout
        while not ready.exists():
            if exited.is_set() or time.monotonic() > deadline:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                raise TierError(f"the memory keeper did not start (see {job_dir / 'memory-keeper.log'})")
            time.sleep(0.02)
        address = ready.read_text(encoding="utf-8").strip()
        ready.unlink(missing_ok=True)
        _write_private(job_dir / RECORD, json.dumps({"pid": pid, "address": address, "token": secret}))
        _remember(address, secret)
        return address


def _write_private(path: Path, text: str) -> None:
    """``path`` replaced by ``text``, readable by its owner alone from the moment it exists (0600)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _spawn_detached(log: Path, ready: Path, *, secret: str | None = None) -> tuple[int, threading.Event]:
    """Start the keeper in a session of its own; a thread reaps it (and sets the event) should it exit.

    ``posix_spawn`` rather than ``Popen``: no object is left to warn that its child still runs, and
    no death signal or process group ties the keeper to the rank. Its secret (a new one when none is
    given) goes in its environment, not its arguments.
    """
    env = {**os.environ, ENV_TOKEN: secret if secret is not None else secrets.token_hex(32)}
    argv = [sys.executable, "-m", KEEPER_MODULE, "--address", "127.0.0.1:0", "--ready-file", str(ready)]
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log), flags, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
        # Nothing of the rank: an inherited gloo socket held open by the keeper would hide the rank's
        # death from its peers (they would wait out the collective timeout instead of seeing it closed).
        *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_descriptors()),
    ]
    pid = os.posix_spawn(sys.executable, argv, env, file_actions=actions, setsid=True)
    exited = threading.Event()
    threading.Thread(target=_reap, args=(pid, exited), daemon=True, name="gpufleet-keeper-reaper").start()
    return pid, exited


def _inheritable_descriptors() -> list[int]:
    """This process's descriptors above 2 that a spawned child would inherit."""
    found = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            with contextlib.suppress(OSError):
                if fd > 2 and os.get_inheritable(fd):
                    found.append(fd)
    return found


def _reap(pid: int, exited: threading.Event) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    exited.set()


def peer_address(env: Mapping[str, str]) -> str | None:
    """``GPUFLEET_MEMORY_PEER`` when set (checked), else ``None``: the job's own keeper is used."""
    raw = env.get(ENV_PEER, "").strip()
    if not raw:
        return None
    parse_address(raw)
    return raw


def peer_token(env: Mapping[str, str]) -> str | None:
    """``GPUFLEET_MEMORY_PEER_TOKEN`` when ``GPUFLEET_MEMORY_PEER`` is set; ``TierError`` when it is missing or bad."""
    if peer_address(env) is None:
        return None
    token = env.get(ENV_TOKEN, "").strip()
    if not SECRET.fullmatch(token):
        raise TierError(
            f"{ENV_PEER} is set but {ENV_TOKEN} is {'unset' if not token else 'not a secret'}: set it to the "
            f"secret the keeper at {env.get(ENV_PEER, '').strip()} was started with "
            f"({MIN_SECRET_CHARS} to 256 printable characters, no spaces)"
        )
    return token


__all__ = [
    "ENV_PEER",
    "ENV_TOKEN",
    "RECORD",
    "PeerClient",
    "answering",
    "ensure_keeper",
    "is_keeper",
    "known_secret",
    "peer_address",
    "peer_token",
    "read_record",
    "running_keeper",
]
