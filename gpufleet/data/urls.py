"""What a ``data`` source may name, and where its files may land: checked before anything is copied.

Three kinds of untrusted text meet the file system here: the source URL a user writes, the
destination folder it lands in, and every object key or file name the store lists under the source
(an S3 key may hold ``..``). Each is checked by a pure function that raises ``ValueError`` with the
value and the fix; nothing here imports fsspec, so a spec validates without the storage stack.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufleet.spec import DataPolicy

REFUSED_PROTOCOLS = frozenset(
    {
        # process-local or wrapping another file system: nothing a job on another node could read
        "memory",
        "cached",
        "blockcache",
        "filecache",
        "simplecache",
        "reference",
        "dir",
        "generic",
        "async_wrapper",
        "asyncwrapper",
        "asynclocal",
        "jupyter",
        "jlab",
        "pyscript",
    }
)
LOCAL_PROTOCOLS = frozenset({"file", "local"})
SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]{0,31})://")
NAME_MAX = 255
PATH_MAX = 4096
SOURCE_HINT = "use a local path, s3://bucket/prefix, gs://, https://, hdfs:// or another fsspec URL"


def _show(text: str, limit: int = 80) -> str:
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _known_protocols() -> frozenset[str]:
    from fsspec.registry import known_implementations, registry

    return frozenset(known_implementations) | frozenset(registry)


def split_source(url: str) -> tuple[str, str]:
    """``(protocol, path)`` of a source: ``("s3", "bucket/prefix")``, ``("file", "/data/x")``.

    A plain path is a local one and must be absolute (``load_spec`` resolves a relative one against
    the spec file's folder first). Raises ``ValueError`` for an unknown or refused protocol, a
    chained URL (``zip://a::s3://b``), a NUL byte or a path over ``PATH_MAX``.
    """
    if not url or not url.strip():
        raise ValueError("a data source is empty: " + SOURCE_HINT)
    if "\0" in url:
        raise ValueError(f"data source {_show(url)} holds a NUL byte, which no path or URL can: remove it")
    if len(url.encode("utf-8", "replace")) > PATH_MAX:
        raise ValueError(f"data source {_show(url)} is over {PATH_MAX} bytes: shorten it")
    if "::" in url:
        raise ValueError(f"data source {_show(url)} chains file systems ('::'): name one store, {SOURCE_HINT}")
    match = SCHEME_RE.match(url)
    if match is None:
        if "://" in url:
            raise ValueError(f"data source {_show(url)} has an invalid URL scheme: {SOURCE_HINT}")
        if not url.startswith("/"):
            raise ValueError(f"data source {_show(url)} is a relative path: give an absolute one, or {SOURCE_HINT}")
        return "file", url
    protocol = match.group(1).lower()
    path = url[match.end() :]
    if protocol in REFUSED_PROTOCOLS or protocol not in _known_protocols():
        raise ValueError(f"unknown URL scheme {protocol!r} in data source {_show(url)}: {SOURCE_HINT}")
    if protocol in LOCAL_PROTOCOLS:
        if not path.startswith("/"):
            raise ValueError(f"data source {_show(url)} is not an absolute path: write file:///absolute/path")
        return "file", path
    if not path.strip("/"):
        raise ValueError(f"data source {_show(url)} names no bucket or path: e.g. {protocol}://bucket/prefix")
    return protocol, path


def check_dest(dest: str) -> str:
    """A destination folder: relative, inside the job's data folder, one or more plain names."""
    if not dest or "\0" in dest or dest.startswith("/") or "\\" in dest:
        raise ValueError(
            f"data destination {_show(dest)!r} must be a relative folder inside the job's data folder, e.g. 'train'"
        )
    check_relative(dest, what="data destination")
    return dest


def check_relative(rel: str, *, what: str = "file") -> str:
    """A relative path under a destination (a listed object key): no ``..``, ``.``, empty or long part."""
    if not rel or len(rel.encode("utf-8", "replace")) > PATH_MAX or "\0" in rel or rel.startswith("/"):
        raise ValueError(f"{what} {_show(rel)!r} is not a relative path inside the data folder")
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(f"{what} {_show(rel)!r} has a {part or 'empty'!r} part: it would land outside its folder")
        if len(part.encode("utf-8", "replace")) > NAME_MAX:
            raise ValueError(f"{what} {_show(rel)!r} has a name over {NAME_MAX} bytes, which no file system takes")
    return rel


def package_hint(protocol: str) -> str | None:
    """What to install for ``protocol``, or ``None`` when its file system imports."""
    from fsspec.registry import get_filesystem_class

    try:
        get_filesystem_class(protocol)
    except (ImportError, ValueError) as err:
        return str(err) or f"the fsspec implementation of {protocol}:// is not installed"
    return None


def check_installed(policy: DataPolicy) -> None:
    """Refuse a source whose file system is not installed here (``gs://`` without gcsfs), naming the package."""
    from gpufleet.errors import UsageError

    for source in policy.sources:
        try:
            protocol, _ = split_source(source.source)
        except ValueError as err:
            raise UsageError(str(err)) from None
        hint = package_hint(protocol)
        if hint is not None:
            raise UsageError(f"data source {_show(source.source)} cannot be read here: {hint}")


__all__ = [
    "LOCAL_PROTOCOLS",
    "REFUSED_PROTOCOLS",
    "SOURCE_HINT",
    "check_dest",
    "check_relative",
    "package_hint",
    "split_source",
]
