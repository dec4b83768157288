"""Files a user names for a command's output (``--out``, ``--html``, ``--plot``): checked before any work.

An existing output that is not a regular file is never replaced by a rename: a character device
(``/dev/null``) is written in place, anything else (a folder, a FIFO, a socket, a block device) is
refused with a ``UsageError`` naming the flag.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from gpufleet.errors import UsageError

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
"""What a plot can be written as (matplotlib picks the format from the suffix)."""
FOLDER_EXAMPLES = {"--port-file": "port", "--out": "model.pt"}
"""The file name suggested inside a folder given to a flag of :func:`check_replaceable_file`
(``ckpt export --out``, ``serve --port-file``, ``observe exporter --port-file``)."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def is_char_device(path: Path) -> bool:
    """Whether ``path`` is a character device (``/dev/null``): written in place, never renamed over."""
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _mode(stat_fn: Callable[[Path], os.stat_result], path: Path, named: str) -> int | None:
    """``path``'s mode by ``stat_fn`` (``os.stat`` or ``os.lstat``), None when it does not exist; a path that
    cannot be one (a folder above it is a file, no permission) refused in one line starting with ``named``."""
    try:
        return stat_fn(path).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise UsageError(f"{named}: a folder above it is a file; give a path in a folder") from None
    except OSError as err:
        raise UsageError(f"{named}: cannot use it ({err.strerror}); pick another path") from None


def check_output_file(path: Path, flag: str) -> Path:
    """``path``, refused (naming ``flag``) when it exists and is not a regular file nor a character device,
    or when a folder above it is a file."""
    mode = _mode(os.stat, path, f"{flag} {path}")
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
        raise UsageError(f"{flag} {path} is {_kind(mode)}, not a file: give the path of a file to write")
    return path


def check_replaceable_file(path: Path, flag: str) -> Path:
    """``path``, refused (naming ``flag``) unless a temporary file beside it can be renamed onto it.

    Called before any work, and before a server binds its port: the path must be a regular file or not
    exist yet, and its folder must exist and be writable. A device (a rename would put a file where
    ``/dev/null`` was), a folder, a FIFO, a socket and a symbolic link (a rename replaces the link, not
    what it points at) are refused, as is a path whose folder is missing, is a file, or is read-only.
    """
    shown = str(path)
    mode = _mode(os.lstat, path, f"{flag} {shown!r}")
    if mode is not None:
        if stat.S_ISCHR(mode):
            raise UsageError(f"{flag} {shown!r} is a device: give the path of a regular file to write")
        if stat.S_ISDIR(mode):
            example = f"{shown.rstrip('/')}/{FOLDER_EXAMPLES.get(flag, 'out')}"
            raise UsageError(f"{flag} {shown!r} is a directory: give the path of a file in it, e.g. {example!r}")
        if stat.S_ISLNK(mode):
            raise UsageError(f"{flag} {shown!r} is a symbolic link: give the path of a regular file to write")
        if not stat.S_ISREG(mode):
            raise UsageError(f"{flag} {shown!r} is {_kind(mode)}, not a file: give the path of a regular file")
    _check_writable_folder(path, flag)
    return path


def _check_writable_folder(path: Path, flag: str) -> None:
    """Refuse ``path`` when its folder is missing, not a folder, or not one this user may create files in."""
    folder = path.parent
    try:
        mode = os.stat(folder).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"{flag} {str(path)!r}: folder {str(folder)!r} does not exist; create it first") from None
    except OSError as err:
        raise UsageError(f"{flag} {str(path)!r}: cannot use its folder ({err.strerror}); pick another path") from None
    if not stat.S_ISDIR(mode):
        raise UsageError(f"{flag} {str(path)!r}: {str(folder)!r} is not a folder; give a path in a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(
            f"{flag} {str(path)!r}: folder {str(folder)!r} is not writable; pick a folder you may write in"
        )


def check_output_dir(path: Path, flag: str) -> Path:
    """``path``, refused (naming ``flag``) when it, or a folder above it, exists and is not a folder, or is a
    link to nothing (which no folder can be made at)."""
    for part in (*reversed(path.parents), path):
        what = "it" if part == path else f"{part}, a folder above it,"
        if part.is_symlink() and not part.exists():
            raise UsageError(f"{flag} {path}: {what} is a link to nothing; give a folder for the output")
        if part.exists() and not part.is_dir():
            raise UsageError(f"{flag} {path}: {what} is a file, not a folder; give a folder for the output")
    return path


def check_plot_file(path: Path, flag: str) -> Path:
    """:func:`check_output_file`, and a suffix matplotlib writes (``.png``, ``.svg`` or ``.pdf``)."""
    if path.suffix.lower() not in PLOT_SUFFIXES and not is_char_device(path):
        raise UsageError(
            f"{flag} {path}: a plot is written as {', '.join(PLOT_SUFFIXES)}; end the name with one of them"
        )
    return check_output_file(path, flag)


def read_tail(path: Path, max_bytes: int) -> tuple[bytes, int] | None:
    """The last ``max_bytes`` of the regular file ``path`` and its size; ``None`` when it is missing or not a
    regular file (a device such as ``/dev/zero``, a FIFO: opened without blocking, never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return read_tail_fd(fd, max_bytes)
    finally:
        os.close(fd)


def read_tail_fd(fd: int, max_bytes: int) -> tuple[bytes, int] | None:
    """:func:`read_tail` of an open descriptor (the caller opened it as it must, and closes it)."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        start = max(0, info.st_size - max_bytes)
        chunks, left = [], max_bytes
        while left > 0 and (chunk := os.pread(fd, min(left, 1 << 20), start + max_bytes - left)):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), info.st_size
    except OSError:
        return None


def replace_output(tmp: Path, path: Path, flag: str = "output") -> None:
    """Move the finished ``tmp`` onto ``path``; a character device is written in place (and ``tmp`` removed)."""
    if is_char_device(path):
        try:
            with open(path, "wb") as sink, open(tmp, "rb") as source:
                while chunk := source.read(1 << 20):
                    sink.write(chunk)
        finally:
            tmp.unlink(missing_ok=True)
        return
    check_output_file(path, flag)
    os.replace(tmp, path)


def write_port_file(path: Path, port: int) -> None:
    """Write the port a server listens on, by a temporary and a rename: a reader never sees half of it,
    and its appearance says the server is ready. On failure the temporary file is removed and a
    ``UsageError`` says why (the path was checked by :func:`check_replaceable_file` before binding)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(str(port), encoding="utf-8")
        tmp.replace(path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write the port file {str(path)!r}: {err.strerror or err}") from None


__all__ = [
    "PLOT_SUFFIXES",
    "check_output_dir",
    "check_output_file",
    "check_plot_file",
    "check_replaceable_file",
    "is_char_device",
    "read_tail",
    "read_tail_fd",
    "replace_output",
    "write_port_file",
]
