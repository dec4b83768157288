"""What a ``data`` source may name, and where its files may land: checked before anything is copied.

Three kinds of untrusted text meet the file system here: the source URL a user writes, the
destination folder it lands in, and every object key or file name the store lists under the source
(an S3 key may hold ``..``). Each is checked by a pure function that raises ``ValueError`` with the
value and the fix; nothing here imports fsspec, so a spec validates without the storage stack.

A source is read from inside the cluster, where a link-local address answers with the node's cloud
credentials (the instance metadata service at 169.254.169.254). A host a source or its
``endpoint_url`` names is refused when it is a link-local or metadata address: at validation where it
is written as an address (or the metadata service's name), and at stage time after it is resolved.
A source opts out with ``allow_link_local: true``.
"""

from __future__ import annotations

import re
import socket
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from gpufleet.spec import DataPolicy

SUPPORTED_PROTOCOLS = frozenset({"file", "local", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "hdfs"})
"""The schemes the stager reads: a local path, and the object stores and file systems that list a prefix
with sizes and read a file by its path (each through its fsspec client). Any other scheme is refused,
whatever fsspec knows: process-local ones (``memory://``), wrappers (``simplecache::``) and web servers
(``http(s)://``, which list no folder and name a file by its whole URL) cannot be staged."""
LOCAL_PROTOCOLS = frozenset({"file", "local"})
HOST_PROTOCOLS = frozenset({"http", "https", "hdfs"})
"""Schemes whose URL names a host to connect to (an ``s3://`` URL names a bucket, its host is ``endpoint_url``)."""
SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]{0,31})://")
LINK_LOCAL = (ip_network("169.254.0.0/16"), ip_network("fe80::/10"))
METADATA_ADDRESSES = frozenset(
    {
        ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack, Oracle
        ip_address("fd00:ec2::254"),  # AWS over IPv6
        ip_address("100.100.100.200"),  # Alibaba Cloud
    }
)
METADATA_NAMES = frozenset({"metadata.google.internal"})
ALLOW_FIELD = "allow_link_local"
NAME_MAX = 255
PATH_MAX = 4096
SOURCE_HINT = "use a local path, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix or hdfs:///path"


def _show(text: str, limit: int = 80) -> str:
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    if protocol not in SUPPORTED_PROTOCOLS:
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


def url_host(url: str) -> str | None:
    """The host ``url`` connects to (``http(s)://``, ``hdfs://``), lower-cased and without brackets; else None."""
    match = SCHEME_RE.match(url)
    if match is None or match.group(1).lower() not in HOST_PROTOCOLS:
        return None
    try:
        host = urlsplit(url).hostname
    except ValueError:
        raise ValueError(f"URL {_show(url)} has an invalid host: write scheme://host[:port]/path") from None
    host = (host or "").rstrip(".")
    return host or None


def literal_address(host: str) -> IPv4Address | IPv6Address | None:
    """``host`` as an address when it is written as one, in any form a resolver takes: ``169.254.169.254``,
    ``fe80::1%eth0``, and the old IPv4 forms ``inet_aton`` reads (``2852039166``, ``0xa9.0xfe.43518``)."""
    try:
        return ip_address(host)
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefxABCDEFX." for c in host) and host[0].isdigit():
        try:
            return IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def is_refused_address(address: IPv4Address | IPv6Address) -> bool:
    """Whether ``address`` is link-local or a cloud metadata service's (an IPv4-mapped IPv6 one included)."""
    if isinstance(address, IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif address.scope_id:
            address = IPv6Address(str(address).split("%", 1)[0])
    return address in METADATA_ADDRESSES or any(address in net for net in LINK_LOCAL)


def _refusal(url: str, host: str, why: str) -> str:
    return (
        f"host {_show(host, 60)} of {_show(url)} is {why}, where a job's node answers with its cloud "
        f"credentials: name another host, or set {ALLOW_FIELD}: true on this source"
    )


def check_hosts(*urls: str | None) -> None:
    """Refuse a URL whose host is written as a link-local or metadata address, or is the metadata service's name.

    What a name resolves to is checked at stage time (:func:`check_resolved_hosts`): a spec is validated
    on the machine that submits it, which may resolve names differently from the node that stages.
    """
    for url in urls:
        host = url_host(url) if url else None
        if host is None:
            continue
        if host in METADATA_NAMES:
            raise ValueError(_refusal(str(url), host, "the name of a cloud metadata service, a link-local address"))
        address = literal_address(host)
        if address is not None and is_refused_address(address):
            raise ValueError(_refusal(str(url), host, "a link-local or cloud metadata address"))


def check_resolved_hosts(*urls: str | None) -> None:
    """:func:`check_hosts`, then every address each host resolves to here; a name that does not resolve is left
    to the store's client, which reports it (with the rest of the network's failures)."""
    check_hosts(*urls)
    for url in urls:
        host = url_host(url) if url else None
        if host is None or literal_address(host) is not None:
            continue
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            continue
        for info in infos:
            address = ip_address(str(info[4][0]).split("%", 1)[0])
            if is_refused_address(address):
                raise ValueError(
                    _refusal(str(url), host, f"resolved to {address}, a link-local or cloud metadata address")
                )


def package_hint(protocol: str) -> str | None:
    """What to install for ``protocol``, or ``None`` when its file system imports."""
    from gpufleet.extras import required

    with required("fsspec", "data", "staging a job's data sources"):
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
    "ALLOW_FIELD",
    "HOST_PROTOCOLS",
    "LOCAL_PROTOCOLS",
    "METADATA_ADDRESSES",
    "METADATA_NAMES",
    "SOURCE_HINT",
    "SUPPORTED_PROTOCOLS",
    "check_dest",
    "check_hosts",
    "check_relative",
    "check_resolved_hosts",
    "is_refused_address",
    "literal_address",
    "package_hint",
    "split_source",
    "url_host",
]
