"""Seeded generators of hostile inputs for every ``gpufleet`` command that reads a file or a number.

A :class:`Case` is one command line (``argv``), the files it reads (written into a fresh working
directory), an optional pre-populated ``$GPUFLEET_HOME`` (:class:`HomeRecipe`) and a few
environment variables. ``make_case(seed, index)`` is a pure function of its two integers (and
of the repository's ``examples/`` and the :class:`Templates` built by :func:`build_templates`):
the runner, a failing test or a person reproduces any case from ``(seed, index)`` alone.

Case ``index`` belongs to surface ``SURFACE_ORDER[index % len(SURFACE_ORDER)]``, so any run of N
consecutive indices covers every surface in fixed proportions (:data:`SURFACE_WEIGHTS`), and its
random choices come from ``random.Random(f"{seed}:{index}")``.

What is thrown at the commands, mixed into *valid* inputs (the shipped examples, a job home shaped
like one a real preempted job leaves) as often as on its own:

* YAML: billion-laughs aliases, 20,000-deep nesting, 5,000-digit integers, documents over the 1 MiB
  limit, ``.inf``/``.nan``/``1e400``/``-0``/``5e-324``/``2**64``, wrong types, missing, unknown and
  duplicate keys, tags, BOMs, tabs, truncation, non-UTF-8 bytes, several documents;
* text: control characters, newlines, U+2028, lone surrogates, Rich markup (``[/]``, ``[bold]``),
  ``str.format`` fields, strings over 4,096 characters, path traversal;
* paths: missing files, directories, FIFOs, ``/dev/zero``, ``/dev/null``, links to ``/dev/zero``,
  link loops, names over NAME_MAX and paths over PATH_MAX;
* numbers on the command line: zero, negative, huge, ``nan``, ``inf``, ``1e400``, other scripts'
  digits;
* tables (CSV, TSV, Parquet, ``.csv.gz``): truncated gzip, NaN/inf columns, duplicate and empty
  headers, a decompression bomb;
* a job's runtime files: hostile ``events.jsonl`` lines (ingested the way the scheduler ingests
  them), GPU logs, attempt logs, checkpoint manifests, and a corrupt ``state.db``;
* ``$GPUFLEET_HOME`` itself: a file, a FIFO, ``/dev/null``, a name too long;
* a home's fleet files (``fleet/fleet.yaml``, ``marks.json``, ``failover.json``) and goodput failure mixes;
* webhook requests: signed (so that they pass the HMAC) hostile JSON bodies and headers.

About a third of the cases are *calm* (``Gen.calm``): every input valid but one extreme, well-typed
value (``2**62``, ``5e-324``, ``1e308``, a 1,000-character name), so that the fuzz also reaches the
code behind the validation instead of being refused at the first field.

Commands that would run for minutes on a valid input (``demo``, ``quality demo``,
``lab-embeddings``, ``lab-policy``, ``debug resume-check``) only ever get inputs that are refused before any work
starts, and the training commands (``profile``, ``debug determinism``) only tiny step counts and a
harmless entrypoint, so a case never trains for long, never starts a scheduler and never runs an
arbitrary function. Output paths (``--out``, ``--html``, ``--plot``, ``--keep``) are relative to the
working directory (or ``/dev/null``): the runner checks that nothing is written anywhere else.
"""

from __future__ import annotations

import copy
import functools
import gzip
import hashlib
import hmac
import json
import math
import os
import random
import sqlite3
import string
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
T0 = 1_796_000_000.0
"""Base Unix time of every job a home recipe holds (late November 2026): fixed, for reproducibility."""
HOME_MARK = "@GPUFLEET_HOME@"
"""Replaced in ``Case.argv`` by the case's home folder when the case runs."""
WEBHOOK_SECRET = b"fuzz-webhook-secret-0123456789abcdef"
WEBHOOK_NOW = 1_800_000_000
"""The receiver's clock in webhook cases; requests are signed at or around it."""


# ---- what a case is ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Special:
    """A file that is not a regular file: a folder, a FIFO, or a symbolic link to ``target``."""

    kind: Literal["dir", "fifo", "symlink"]
    target: str = ""

    def describe(self) -> str:
        return f"<{self.kind}{' -> ' + self.target if self.target else ''}>"


FileContent = bytes | Special


@dataclass
class HomeJob:
    """One job row of ``state.db`` with its folder ``jobs/<id>/``; values may be hostile on purpose."""

    spec: dict[str, Any] | None
    """A valid JobSpec mapping, stored as gpufleet stores it; ``raw_spec`` wins when set."""
    raw_spec: str | None = None
    name: Any = "job"
    team: Any = "perception"
    priority: Any = 0
    backend: Any = "local"
    backend_ref: Any = None
    state: Any = "completed"
    reason: Any = None
    submitted_at: Any = T0
    updated_at: Any = T0 + 60
    restarts: Any = 0
    env_text: Any = "{}"
    events_offset: Any = 0
    attempts: list[tuple[Any, ...]] = field(default_factory=list)
    """``(n, state, pid, started_at, ended_at, exit_code, outcome)`` rows."""
    db_events: list[tuple[Any, Any, Any, Any, Any]] = field(default_factory=list)
    """``(attempt, ts, kind, source, data_text)`` rows the backend side writes."""
    events_jsonl: FileContent | None = None
    ingest: bool = True
    """Ingest ``events.jsonl`` into the database the way the scheduler does (``ingest_events``)."""
    files: dict[str, FileContent] = field(default_factory=dict)
    """Files under ``jobs/<id>/`` (logs, GPU logs, checkpoints, ``spec.json``)."""


@dataclass
class HomeRecipe:
    jobs: list[HomeJob] = field(default_factory=list)
    files: dict[str, FileContent] = field(default_factory=dict)
    """Files under the home, written last (they may replace ``state.db``)."""


@dataclass
class Case:
    seed: int
    index: int
    surface: str
    argv: list[str]
    """Arguments after ``gpufleet``; :data:`HOME_MARK` stands for the case's ``$GPUFLEET_HOME``."""
    files: dict[str, FileContent] = field(default_factory=dict)
    """Files written into the working directory before the command runs."""
    home: HomeRecipe | None = None
    env: dict[str, str] = field(default_factory=dict)
    target: str = "cli"
    """``cli`` runs ``gpufleet.cli.app.main``; ``webhook`` runs ``AlertReceiver.handle`` on the request files."""
    serves: str | None = None
    """A command that serves until SIGTERM: the runner stops it once this file (its port) appears."""
    serves_path: str = "/metrics"
    """What the runner GETs from a serving case; it must answer 200."""
    service_exit_ok: bool = False
    """Exit 3 (a network service is unreachable) is a legitimate outcome of this case."""
    notes: list[str] = field(default_factory=list)
    http: list[HttpStep] | None = None
    """A serving case's exchanges: sent (raw bytes) instead of the one GET of ``serves_path``."""
    private: tuple[str, ...] = ()
    """Files of the case made mode 0600 before the command runs (a token file only its owner reads)."""
    must_refuse: bool = False
    """The input is one the command must catch: exit 0 is a violation (crafted metadata, say)."""
    quiet: bool = False
    """At most one non-empty stderr line and no warning, whatever the exit status."""

    def describe_files(self) -> dict[str, str]:
        """Each input file in a line: its size and a short preview, for a report."""
        return {name: _preview(content) for name, content in self.files.items()}


TOKEN_MARK = b"@TOKEN@"
"""Replaced in an :class:`HttpStep`'s request by the server's token (read from its token file)."""
PORT_MARK = b"@PORT@"
"""Replaced in an :class:`HttpStep`'s request by the port the server listens on."""
INDEX_MARK = b"@N@"
"""Replaced by the repetition's number in a step sent ``repeat`` times."""


@dataclass(frozen=True)
class HttpStep:
    """One exchange with a serving case: raw request bytes over a fresh loopback connection.

    ``statuses``: what the answer must be (empty: anything below 500). ``allow_503``: a 503 is
    legitimate (the connection cap, a webhook without a secret). ``slow``: connections opened
    first, each sent half a request head and left open while this request is sent. ``repeat``:
    the request is sent this many times, :data:`INDEX_MARK` replaced by the repetition's number.
    """

    label: str
    raw: bytes
    statuses: tuple[int, ...] = ()
    allow_503: bool = False
    slow: int = 0
    repeat: int = 1

    def describe(self) -> str:
        line = self.raw.split(b"\r\n", 1)[0].decode("latin-1")
        return f"{self.label}: {_clip_text(line, 120)}"


def _clip_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[: limit - 20]}...({len(text)} chars)"


def _preview(content: FileContent, limit: int = 160) -> str:
    if isinstance(content, Special):
        return content.describe()
    head = content[:limit].decode("utf-8", "backslashreplace")
    return f"{len(content)} bytes: {head!r}" + ("..." if len(content) > limit else "")


# ---- hostile values ------------------------------------------------------------------------------

HOSTILE_STRINGS: tuple[str, ...] = (
    "",
    " ",
    "a" * 5000,
    "x" * 300,
    "\x00",
    "a\nb",
    "line1\r\nline2",
    "\t",
    "\u2028",
    "sep\u2029par",
    "\ud800",
    "\udcff\udc80",
    "\x1b[31mred\x1b[0m",
    "\x7f\x9b",
    "[/]",
    "[bold]bold",
    "[red]x[/red][/]",
    "[link=file:///etc/passwd]x[/link]",
    ":smile:",
    "{0}",
    "{gpus}",
    "{x!r:>99999}",
    "%s%n%x",
    "$(id)",
    "`id`",
    "${HOME}",
    "../../etc/passwd",
    "/etc/passwd",
    "a/b",
    ".",
    "..",
    "~",
    "-",
    "--help",
    "-x",
    "é",
    "Ω≈ç√",
    "日本語",
    "🚀",
    "\u202eevil",
    "\ufeffbom",
    "null",
    "true",
    "no",
    "NaN",
    "1e400",
    "*",
    "?",
    "a;b|c&d",
    "'",
    '"',
    "\\",
    "%",
    "H100",
    "aws",
    "perception",
    "toy",
)

NUMBER_TEXTS: tuple[str, ...] = (
    "0",
    "-0",
    "-0.0",
    "-1",
    "1",
    "2",
    "0.5",
    "3.5",
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "+inf",
    "Infinity",
    "1e400",
    "-1e400",
    "1e-400",
    "5e-324",
    "1e308",
    "1e15",
    "1e16",
    str(2**31),
    str(2**53 + 1),
    str(2**63 - 1),
    str(2**63),
    str(2**64),
    str(-(2**63) - 1),
    "9" * 30,
    "9" * 5000,
    "0x10",
    "0o17",
    "1_000",
    "1e3",
    "\u0661\u0662\u0663",
    "¹",
    "1,5",
    "",
    " ",
    " 7 ",
    "abc",
    "1e",
    "--1",
)

EDGE_VALID_FLOATS: tuple[float, ...] = (5e-324, 1e-300, 1e-9, 0.0, -0.0, 1e15, 1e300, 1.7976931348623157e308, 0.999999)
EDGE_VALID_INTS: tuple[int, ...] = (0, 1, 2, 3, 1000, 2**31 - 1, 2**31, 2**53, 2**62, 2**63 - 1, 10**15, 10**18)
EDGE_VALID_STRINGS: tuple[str, ...] = ("a", "x" * 63, "a.b-c_d", "0", "[bold]", "é", "a" * 1000, "*", "cpu", "H100")
CALM_NUMBERS: tuple[str, ...] = (
    "1",
    "2",
    "3",
    "1000",
    "65536",
    str(2**31),
    str(2**53),
    str(2**62),
    "1e9",
    "1e15",
    "0.001",
)
EDGE_FLOATS: tuple[float, ...] = (math.inf, -math.inf, math.nan, -0.0, 5e-324, 1e308, -1e308, 1e-300, 0.1, -1.5)
EDGE_INTS: tuple[int, ...] = (0, -1, 1, 2, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**99)
RAW_YAML_SCALARS: tuple[str, ...] = (
    "9" * 5000,
    "-" + "9" * 150,
    "1e400",
    "-1e400",
    ".inf",
    "-.Inf",
    ".NaN",
    "0x_ff",
    "0o777",
    "0b101",
    "1_000_000",
    "190:20:30",
    "!!float 1e400",
    "!!int '12'",
    "!!str 12",
    "!!binary aGVsbG8=",
    "!!timestamp 2026-13-45",
    "2026-02-30",
    "2026-12-01T25:00:00",
    "!!python/object/apply:os.system ['id']",
    "!!python/name:os.system",
    "!!set {a, b}",
    "!!omap [a: 1, b: 2]",
    "*undefined_alias",
    "&anchor 5",
    "? complex\n  : key",
    "|\n  block\n  text",
    '"\\ud800"',
    '"\\x00\\x1b"',
    '"\\U0010FFFF"',
    "~",
    "''",
    "[]",
    "{}",
    "[[[[[[[[]]]]]]]]",
    "!custom tag",
)


def sanitize_argv(text: str) -> str:
    """``text`` as a real command line can carry it: no NUL, surrogates only as ``surrogateescape`` bytes."""
    out = []
    for ch in text:
        if ch == "\x00":
            out.append("\\0")
        elif "\ud800" <= ch <= "\udfff" and not "\udc80" <= ch <= "\udcff":
            out.append("\udcff")
        else:
            out.append(ch)
    return "".join(out)


class Gen:
    """The random choices of one case, and the files and notes it accumulates."""

    def __init__(self, rng: random.Random, templates: Templates) -> None:
        self.rng = rng
        self.calm = rng.random() < 0.3
        """A calm case keeps most inputs valid, so that one odd value reaches the code behind validation."""
        self.templates = templates
        self.files: dict[str, FileContent] = {}
        self.notes: list[str] = []
        self.env: dict[str, str] = {}
        self._names = 0

    # -- choices
    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, seq: Sequence[Any]) -> Any:
        return seq[self.rng.randrange(len(seq))]

    def note(self, text: str) -> None:
        self.notes.append(text)

    def string(self) -> str:
        return str(self.pick(HOSTILE_STRINGS))

    def arg_string(self, *valid: str, p_valid: float = 0.5) -> str:
        """A value for a text option: one of ``valid`` or a hostile string."""
        if valid and self.chance(max(p_valid, 0.92) if self.calm else p_valid):
            return str(self.pick(valid))
        return sanitize_argv(self.string())

    def number_text(self, *valid: str | int | float, p_valid: float = 0.4) -> str:
        """A value for a numeric option: one of ``valid`` (as text) or a hostile number."""
        if valid and self.chance(max(p_valid, 0.85) if self.calm else p_valid):
            return str(self.pick(valid))
        if self.calm:
            return str(self.pick(CALM_NUMBERS))
        return str(self.pick(NUMBER_TEXTS))

    def name(self, stem: str, suffix: str) -> str:
        self._names += 1
        return f"{stem}{self._names}{suffix}"

    # -- files
    def add_file(self, name: str, content: FileContent) -> str:
        self.files[name] = content
        return name

    def input_path(self, stem: str, suffix: str, make: Callable[[], bytes], *, p_special: float = 0.12) -> str:
        """A path for an input option: usually a file holding ``make()``, sometimes a hostile path."""
        if self.chance(p_special / 5 if self.calm else p_special):
            return self.special_input(stem, suffix, make)
        return self.add_file(self.name(stem, suffix), make())

    def special_input(self, stem: str, suffix: str, make: Callable[[], bytes]) -> str:
        kind = self.pick(SPECIAL_INPUTS)
        self.note(f"input path: {kind}")
        name = self.name(stem, suffix)
        if kind == "missing":
            return name
        if kind == "dir":
            return self.add_file(name, Special("dir"))
        if kind == "fifo":
            return self.add_file(name, Special("fifo"))
        if kind == "link-zero":
            return self.add_file(name, Special("symlink", "/dev/zero"))
        if kind == "link-loop":
            self.add_file(name + ".b", Special("symlink", name))
            return self.add_file(name, Special("symlink", name + ".b"))
        if kind == "dangling":
            return self.add_file(name, Special("symlink", "no/such/target"))
        if kind == "long-name":
            return "n" * 300 + suffix
        if kind == "long-path":
            return "/".join(["d" * 200] * 22) + "/x" + suffix
        if kind == "newline-name":
            return self.add_file(f"bad\nname{self._names}{suffix}", make())
        if kind == "markup-name":
            return self.add_file(f"[bold]x[/]{self._names}{suffix}", b"{{{{not yaml")
        if kind == "traversal":
            return "../../../../../../etc/passwd"
        if kind == "empty-arg":
            return ""
        return str(kind)  # an absolute path (read only): /dev/zero, /dev/null, /etc/passwd, /proc/self/status

    def out_path(self, stem: str, suffix: str) -> str:
        """A path for an output option: inside the working directory, or one that cannot be written."""
        roll = self.rng.random()
        if roll < (0.9 if self.calm else 0.6):
            return self.name(stem, suffix)
        kind = self.pick(SPECIAL_OUTPUTS)
        self.note(f"output path: {kind}")
        name = self.name(stem, suffix)
        if kind == "dir":
            return self.add_file(name, Special("dir"))
        if kind == "missing-parent":
            return f"no/such/folder/{name}"
        if kind == "parent-is-file":
            self.add_file("plainfile", b"x")
            return f"plainfile/{name}"
        if kind == "existing":
            return self.add_file(name, b"old content\n")
        if kind == "link-devnull":
            return self.add_file(name, Special("symlink", "/dev/null"))
        if kind == "dangling":
            return self.add_file(name, Special("symlink", "gone/away"))
        if kind == "long-name":
            return "o" * 300 + suffix
        if kind == "trailing-slash":
            return name + "/"
        if kind == "empty-arg":
            return ""
        if kind == "dot":
            return "."
        if kind == "subdir":
            return f"sub/../{name}"
        return str(kind)  # /dev/null, /dev/full


SPECIAL_INPUTS: tuple[str, ...] = (
    "missing",
    "dir",
    "fifo",
    "link-zero",
    "link-loop",
    "dangling",
    "long-name",
    "long-path",
    "newline-name",
    "markup-name",
    "traversal",
    "empty-arg",
    "/dev/zero",
    "/dev/null",
    "/etc/passwd",
    "/proc/self/status",
)
SPECIAL_OUTPUTS: tuple[str, ...] = (
    "dir",
    "missing-parent",
    "parent-is-file",
    "existing",
    "link-devnull",
    "dangling",
    "long-name",
    "trailing-slash",
    "empty-arg",
    "dot",
    "subdir",
    "/dev/null",
    "/dev/full",
)


# ---- hostile YAML --------------------------------------------------------------------------------


def hostile_value(g: Gen, depth: int = 0) -> Any:
    roll = g.rng.random()
    if roll < 0.25:
        return g.pick(EDGE_FLOATS)
    if roll < 0.45:
        return g.pick(EDGE_INTS)
    if roll < 0.75:
        return g.string()
    if roll < 0.8:
        return g.pick((None, True, False))
    if roll < 0.85 or depth > 2:
        return g.pick(([], {}, [None], {"": None}))
    if roll < 0.9:
        return [hostile_value(g, depth + 1) for _ in range(g.rng.randint(1, 3))]
    if roll < 0.95:
        return {str(g.string())[:50]: hostile_value(g, depth + 1)}
    nested: Any = 1
    for _ in range(70):
        nested = [nested]
    return nested


def _paths(obj: Any, prefix: tuple[Any, ...] = (), limit: int = 400) -> list[tuple[Any, ...]]:
    """Paths (keys and indices) to every node of a parsed document, the root included."""
    out: list[tuple[Any, ...]] = [prefix]
    stack: list[tuple[tuple[Any, ...], Any]] = [(prefix, obj)]
    while stack and len(out) < limit:
        path, node = stack.pop()
        children: list[tuple[Any, Any]] = []
        if isinstance(node, dict):
            children = list(node.items())
        elif isinstance(node, list):
            children = list(enumerate(node))
        for key, child in children:
            out.append((*path, key))
            stack.append(((*path, key), child))
    return out


def _get(obj: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    _get(obj, path[:-1])[path[-1]] = value
    return obj


RAW_MARK = "__RAW_{}__"


def mutate_tree(g: Gen, obj: Any, raws: list[str], *, edge_only: bool = False) -> Any:
    """One structural mutation of a parsed document (``raws`` collects raw YAML text to splice in).

    ``edge_only``: only put an extreme but well-typed value in a number's or a string's place, the
    kind of change strict validation may let through.
    """
    paths = _paths(obj)
    if edge_only:
        leaves = [
            p for p in paths if isinstance(_get(obj, p), (int, float, str)) and not isinstance(_get(obj, p), bool)
        ]
        if leaves:
            path = g.pick(leaves)
            node = _get(obj, path)
            value = (
                g.pick(EDGE_VALID_FLOATS if isinstance(node, float) else EDGE_VALID_INTS)
                if not isinstance(node, str)
                else g.pick(EDGE_VALID_STRINGS)
            )
            g.note(f"{'.'.join(str(p) for p in path)}: {_short(value)}")
            return _set(obj, path, value)
    path = g.pick(paths)
    node = _get(obj, path)
    shown = ".".join(str(p) for p in path) or "(root)"
    op = g.pick(("replace", "replace", "replace", "edge", "delete", "unknown", "wrap", "type", "raw", "many", "key"))
    if op == "delete" and path:
        parent = _get(obj, path[:-1])
        del parent[path[-1]]
        g.note(f"deleted {shown}")
        return obj
    if op == "unknown" and isinstance(node, dict):
        key = g.pick(("bogus_field", "Name", "name ", "", "__class__", 10**30, 1.5, None, True, "a" * 300))
        node[key] = hostile_value(g)
        g.note(f"unknown key {key!r} in {shown}")
        return obj
    if op == "key" and isinstance(node, dict) and node:
        old = g.pick(list(node))
        new = g.pick((str(old).upper(), f"{old}_", str(old) + "\u200b", 0, None, str(old) * 100))
        node[new] = node.pop(old)
        g.note(f"renamed key {old!r} to {new!r}")
        return obj
    if op == "wrap":
        g.note(f"wrapped {shown} in a list")
        return _set(obj, path, [node])
    if op == "type":
        swapped = g.pick((str(node), [node], {"value": node}, len(str(node)), None, True, "12"))
        g.note(f"{shown}: wrong type {type(swapped).__name__}")
        return _set(obj, path, swapped)
    if op == "raw":
        raw = str(g.pick(RAW_YAML_SCALARS))
        raws.append(raw)
        g.note(f"{shown}: raw YAML {raw[:40]!r}")
        return _set(obj, path, RAW_MARK.format(len(raws) - 1))
    if op == "many" and isinstance(node, list) and node:
        count = g.pick((100, 5000, 60_000))
        g.note(f"{shown}: {count} copies of an item")
        return _set(obj, path, [copy.deepcopy(node[0]) for _ in range(count)])
    if op == "edge" and isinstance(node, (int, float)) and not isinstance(node, bool):
        value = g.pick(EDGE_FLOATS + EDGE_INTS)
        g.note(f"{shown}: {value!r}")
        return _set(obj, path, value)
    value = hostile_value(g)
    g.note(f"{shown}: {_short(value)}")
    return _set(obj, path, value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def dump_yaml(obj: Any, raws: Sequence[str] = ()) -> str:
    text = yaml.safe_dump(obj, sort_keys=False, allow_unicode=True, default_flow_style=None, width=100_000)
    for i, raw in enumerate(raws):
        mark = RAW_MARK.format(i)
        text = text.replace(f"'{mark}'", mark).replace(mark, raw, 1)
    return text


def mutate_text(g: Gen, text: str) -> bytes:
    """A mutation of YAML text that a tree cannot express (duplicate keys, bytes, encodings...)."""
    op = g.pick(
        (
            "dup-key",
            "tab",
            "bom",
            "truncate",
            "control",
            "second-doc",
            "non-utf8",
            "utf16",
            "nel",
            "crlf",
            "merge",
            "anchor-self",
            "comment-huge",
        )
    )
    g.note(f"text: {op}")
    lines = text.splitlines(keepends=True) or ["\n"]
    if op == "dup-key":
        top = [line for line in lines if line[:1].isalpha()]
        if top:
            return (text + str(g.pick(top))).encode()
    if op == "tab":
        i = g.rng.randrange(len(lines))
        lines[i] = "\t" + lines[i]
        return "".join(lines).encode()
    if op == "bom":
        return ("\ufeff" + text).encode()
    if op == "truncate":
        return text.encode()[: g.rng.randrange(max(1, len(text)))]
    if op == "control":
        i = g.rng.randrange(len(text) + 1)
        return (text[:i] + str(g.pick(("\x00", "\x1b", "\x07", "\x85", "\u2028", "\ufffe"))) + text[i:]).encode(
            "utf-8", "surrogatepass"
        )
    if op == "second-doc":
        return (text + "---\nsecond: document\n").encode()
    if op == "non-utf8":
        data = bytearray(text.encode())
        data.insert(g.rng.randrange(len(data) + 1), g.pick((0xFF, 0xC3, 0x80, 0xED)))
        return bytes(data)
    if op == "utf16":
        return text.encode("utf-16")
    if op == "nel":
        return text.replace("\n", "\x85").encode()
    if op == "crlf":
        return text.replace("\n", "\r\n").encode()
    if op == "merge":
        return ("base: &base {x: 1}\n" + text + "<<: *base\n").encode()
    if op == "anchor-self":
        return (text + "loop: &l [*l]\n").encode()
    return (text + "# " + "c" * (1 << 20) + "\n").encode()


def yaml_bomb(g: Gen) -> bytes:
    kind = g.pick(("laughs", "deep-list", "deep-map", "deep-block", "long-int", "over-1mib", "flat-many", "aliases"))
    g.note(f"bomb: {kind}")
    if kind == "laughs":
        lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
        for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
            lines.append(f"{cur}: &{cur} [{','.join([f'*{prev}'] * 9)}]")
        return ("\n".join(lines) + "\n").encode()
    if kind == "deep-list":
        return ("x: " + "[" * 20_000 + "]" * 20_000 + "\n").encode()
    if kind == "deep-map":
        return ("{a: " * 20_000 + "1" + "}" * 20_000 + "\n").encode()
    if kind == "deep-block":
        return "".join("  " * i + "- \n" for i in range(2000)).encode()
    if kind == "long-int":
        return ("name: x\nsteps: " + "9" * 5000 + "\n").encode()
    if kind == "over-1mib":
        return b"name: big\n# " + b"x" * (1 << 20) + b"\n"
    if kind == "flat-many":
        return ("[" + ",".join("1" for _ in range(250_000)) + "]\n").encode()
    return ("a: &a [1, 2]\nb: [" + ", ".join(["*a"] * 150_000) + "]\n").encode()


def hostile_bytes(g: Gen) -> bytes:
    kind = g.pick(("empty", "nul", "random", "non-utf8", "gzip", "png", "only-comment", "scalar", "list", "huge-line"))
    g.note(f"bytes: {kind}")
    if kind == "empty":
        return b""
    if kind == "nul":
        return b"\x00" * g.rng.randint(1, 512)
    if kind == "random":
        return bytes(g.rng.randrange(256) for _ in range(g.rng.randint(1, 4096)))
    if kind == "non-utf8":
        return b"name: caf\xe9\nteam: \xff\xfe\n"
    if kind == "gzip":
        return b"\x1f\x8b\x08\x00" + bytes(g.rng.randrange(256) for _ in range(64))
    if kind == "png":
        return b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    if kind == "only-comment":
        return b"# nothing here\n"
    if kind == "scalar":
        return bytes(g.pick((b"42\n", b"~\n", b"just text\n", b"- \n", b"!!binary aGk=\n")))
    if kind == "list":
        return b"- a\n- b\n"
    return b"k: " + b"v" * (2 << 20) + b"\n"


def yaml_doc(g: Gen, base: Any, *, valid_share: float = 0.15) -> bytes:
    """A YAML document derived from ``base``: valid, mutated (tree and text), a bomb, or junk bytes."""
    roll = g.rng.random()
    if roll < 0.07 and not g.calm:
        return hostile_bytes(g)
    if roll < 0.15 and not g.calm:
        return yaml_bomb(g)
    obj = copy.deepcopy(base)
    raws: list[str] = []
    if not g.chance(0.5 if g.calm else valid_share):
        for _ in range(1 if g.calm else g.rng.randint(1, 3)):
            obj = mutate_tree(g, obj, raws, edge_only=g.calm)
    text = dump_yaml(obj, raws)
    if g.chance(0.15) and not g.calm:
        return mutate_text(g, text)
    return text.encode("utf-8", "surrogatepass")


# ---- the shipped examples and other valid inputs -------------------------------------------------

_EXAMPLE_CACHE: dict[str, Any] = {}


def example(name: str) -> Any:
    """A parsed example under ``examples/`` (a fresh copy each call)."""
    if name not in _EXAMPLE_CACHE:
        _EXAMPLE_CACHE[name] = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    return copy.deepcopy(_EXAMPLE_CACHE[name])


FULL_SPEC: dict[str, Any] = {
    "name": "tinylm",
    "team": "perception",
    "entrypoint": "gpufleet.workloads.tinylm:train",
    "args": {"steps": 400},
    "workdir": ".",
    "resources": {"gpu_type": "A100", "gpus": 1, "cpus": 2, "nodes": 1},
    "priority": 10,
    "provider": "local",
    "spot": True,
    "checkpoint": {
        "every_steps": 50,
        "every_seconds": 600,
        "keep": 3,
        "grace_seconds": 30,
        "keep_best": {"metric": "val_loss", "mode": "min"},
        "on_no_space": "continue",
        "async": False,
    },
    "health": {
        "spike_zscore": 8.0,
        "window": 50,
        "min_history": 20,
        "action": "rollback",
        "max_rollbacks": 5,
        "skip_extra_batches": 0,
    },
    "max_restarts": 10,
    "resume": "auto",
    "env": {"MY_FLAG": "1"},
    "telemetry": {"gpu_source": "synthetic:healthy", "sample_seconds": 5.0, "precision": "bf16"},
    "placement": {"workload": "training", "gpu_hours": 10, "checkpoint_gb": 1.0, "save_seconds": 20},
}
SPEC_EXAMPLES = ("toy.yaml", "tinylm.yaml", "tinylm-ddp.yaml", "tinylm-fsdp.yaml", "nanogpt/nanogpt.yaml")


def valid_spec(g: Gen) -> dict[str, Any]:
    roll = g.rng.random()
    if roll < 0.2:
        return copy.deepcopy(FULL_SPEC)
    if roll < 0.35:
        jobs = example("batch.yaml")["jobs"]
        return dict(g.pick(jobs))
    spec: dict[str, Any] = example(g.pick(SPEC_EXAMPLES))
    return spec


def rate_card() -> dict[str, Any]:
    text = (REPO / "gpufleet" / "cost" / "default_rates.yaml").read_text(encoding="utf-8")
    card: dict[str, Any] = yaml.safe_load(text)
    return card


SLO_FULL: dict[str, Any] = {
    "availability": 0.99,
    "failure_rate": 0.05,
    "oom_rate": 0.01,
    "queue_wait_p50_s": 120,
    "queue_wait_p95_s": 600,
    "tokens_per_s_per_job": None,
    "tokens_per_gpu_hour": 1e6,
}
WORKLOAD_FULL: dict[str, Any] = {
    "daily_amplitude": 0.5,
    "peak_hour": 15.0,
    "gpus": {1: 0.45, 2: 0.25, 4: 0.18, 8: 0.12},
    "hours": {"median": 1.0, "sigma": 1.0, "low": 0.1, "high": 240.0},
    "workloads": {"training": 0.6, "finetune": 0.4},
    "teams": {"perception": 0.5, "language": 0.5},
    "priorities": {0: 0.8, 10: 0.2},
    "spot_share": 0.7,
    "pinned_share": 0.3,
    "deadline_share": 0.3,
    "deadline_slack": [1.5, 6.0],
    "checkpoint_minutes": {15.0: 0.3, 30.0: 0.5, 60.0: 0.2},
    "save_seconds": {"median": 20.0, "sigma": 0.5, "low": 1.0, "high": 900.0},
    "restore_seconds": {"median": 120.0, "sigma": 0.5, "low": 5.0, "high": 3600.0},
    "checkpoint_gb": {"median": 20.0, "sigma": 1.0, "low": 0.1, "high": 5000.0},
    "outages": {"region_per_day": 0.02, "region_hours": 2.0, "provider_per_day": 0.005, "provider_hours": 4.0},
    "failover": {"cooldown_hours": 1.0, "preemptions": 3, "window_hours": 1.0},
    "whole_nodes": False,
    "drain_days": 7.0,
}
HOSTLISTS: tuple[str, ...] = (
    "gpu[0-99999999]",
    "gpu[1-3",
    "gpu[3-1]",
    "gpu[01-1000000000000]",
    "a[1-9]b[1-9]c[1-9]d[1-9]e[1-9]f[1-9]",
    "gpu[]",
    "gpu[-1-5]",
    "gpu[1-5:2]",
    "gpu[1-2,01-02]",
    "gpu[" + "9" * 400 + "]",
    ",,,",
    "gpu 01",
    "gpu[1-4],gpu[1-4]",
    "leaf[1-4]",
    "[bold]",
)


# ---- the templates: a real checkpoint folder and Parquet files -----------------------------------


@dataclass
class Templates:
    """Binary inputs built once per run in a throwaway process (see :func:`build_templates`)."""

    files: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path | None) -> Templates:
        if root is None or not root.is_dir():
            return cls()
        return cls({str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()})

    def under(self, prefix: str) -> dict[str, bytes]:
        return {k[len(prefix) :]: v for k, v in self.files.items() if k.startswith(prefix)}


def build_templates(root: Path) -> None:
    """Write a valid two-checkpoint folder (``ckpt/``) and small Parquet tables (``parquet/``) under ``root``.

    Run in a subprocess of its own: torch and pyarrow may start threads, and the fork server must not.
    """
    import pandas as pd
    import torch

    from gpufleet.runtime.checkpoint import CheckpointDir

    torch.set_num_threads(1)
    ckpts = CheckpointDir(root / "ckpt", keep=10)
    for step in (10, 20):
        weight = torch.arange(12, dtype=torch.float32).reshape(3, 4) / (step + 1)
        state = {
            "model": {"weight": weight, "bias": torch.zeros(3)},
            "optimizer": {"state": {}, "param_groups": []},
            "trainer": {"step": step, "objects": ["model", "optimizer", "trainer"]},
        }
        ckpts.save(step, state, loss=1.0 / step, job="1", metrics={"val_loss": 2.0 / step})
    for manifest in (root / "ckpt").glob("step-*/manifest.json"):
        data = json.loads(manifest.read_text())
        data["created_at"], data["save_seconds"] = T0, 0.01
        manifest.write_text(json.dumps(data, indent=2, sort_keys=True))
    folder = root / "parquet"
    folder.mkdir(parents=True)
    rng = random.Random(0)
    n = 200
    tables = {
        "numeric": pd.DataFrame({"x": [rng.gauss(0, 1) for _ in range(n)], "y": [rng.random() for _ in range(n)]}),
        "shifted": pd.DataFrame({"x": [rng.gauss(2, 1) for _ in range(n)], "y": [rng.random() for _ in range(n)]}),
        "mixed": pd.DataFrame(
            {
                "x": [rng.gauss(0, 1) for _ in range(n)],
                "cat": [rng.choice("abc") for _ in range(n)],
                "flag": [rng.random() < 0.5 for _ in range(n)],
                "n": list(range(n)),
            }
        ),
        "nonfinite": pd.DataFrame({"x": [math.nan, math.inf, -math.inf, 1.0] * 50, "y": [None, 1.0, 2.0, 3.0] * 50}),
        "empty": pd.DataFrame({"x": pd.Series([], dtype="float64")}),
        "strings": pd.DataFrame({"x": ["\ud800".encode("utf-8", "surrogatepass").decode("latin-1"), "[/]", "é"] * 10}),
        "nested": pd.DataFrame({"x": [[1, 2], [3], []] * 10}),
        "dates": pd.DataFrame({"x": pd.date_range("2026-01-01", periods=30, freq="h")}),
    }
    for name, frame in tables.items():
        frame.to_parquet(folder / f"{name}.parquet")
    build_dcp_templates(root)


DCP_STEP = "step-00000010"
DCP_OUTSIDE = "outside.distcp"
"""A copy of the real shard, placed outside the checkpoint folder: crafted metadata points at it."""
DCP_VARIANTS: dict[str, str] = {
    "outside-parent": "outside",
    "outside-up2": "outside",
    "outside-fifo": "outside",
    "absolute-passwd": "outside",
    "absolute-zero": "outside",
    "absolute-environ": "outside",
    "unlisted": "outside",
    "missing": "outside",
    "folder": "outside",
    "rank-file": "broken",
    "offset-huge": "broken",
    "offset-negative": "broken",
    "offset-shift": "broken",
    "length-huge": "broken",
    "length-zero": "broken",
    "pickle-dict": "broken",
    "pickle-gadget": "broken",
    "metadata-empty": "broken",
    "truncated": "broken",
}
"""The crafted ``.metadata`` files of ``dcp-meta/``: ``outside`` ones name a file the manifest does not
list (``verify`` and ``export`` must both refuse them); ``broken`` ones point into listed files wrongly
or hold something else (``export`` must refuse them)."""
DCP_PATHS: dict[str, str] = {
    "outside-parent": f"../{DCP_OUTSIDE}",
    "outside-up2": f"../../{DCP_OUTSIDE}",
    "outside-fifo": "../../outside.fifo",
    "absolute-passwd": "/etc/passwd",
    "absolute-zero": "/dev/zero",
    "absolute-environ": "/proc/self/environ",
    "unlisted": "__9_0.distcp",
    "missing": "__5_0.distcp",
    "folder": ".",
    "rank-file": "rank-00000.pt",
}


class _Gadget:
    """A pickle that makes a folder when unpickled by a loader that trusts any global."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, ("../../../unpickled-by-metadata",))


def build_dcp_templates(root: Path) -> None:
    """A sharded (``dcp``) checkpoint of a group of one (``dcp/``), and crafted ``.metadata`` files (``dcp-meta/``)."""
    import dataclasses
    import io
    import pickle

    import torch

    from gpufleet.runtime.checkpoint import CheckpointDir
    from gpufleet.runtime.group import Group
    from gpufleet.runtime.sharded import save_sharded

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    trainer = io.BytesIO()
    torch.save({"step": 10, "data_position": 10}, trainer)
    save_sharded(
        CheckpointDir(root / "dcp", keep=10),
        Group(),
        10,
        {"model": model.state_dict(), "trainer": trainer},
        {"rank": 0},
        healthy=True,
        loss=0.5,
        data_position=10,
        reason="periodic",
        meta={},
        job="1",
        fingerprint=None,
        metrics={},
        strategy="none",
    )
    step = root / "dcp" / DCP_STEP
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["created_at"], manifest["save_seconds"] = T0, 0.01
    (step / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    raw = (step / ".metadata").read_bytes()
    out = root / "dcp-meta"
    out.mkdir(parents=True)
    for variant in DCP_VARIANTS:
        metadata = pickle.loads(raw)  # the file DCP itself just wrote
        storage = metadata.storage_data
        first = sorted(storage, key=str)[0]
        info = storage[first]
        if variant in DCP_PATHS:
            for key, item in storage.items():
                storage[key] = dataclasses.replace(item, relative_path=DCP_PATHS[variant])
        elif variant.startswith(("offset", "length")):
            change = {
                "offset-huge": {"offset": 2**62},
                "offset-negative": {"offset": -1},
                "offset-shift": {"offset": info.offset + 1},
                "length-huge": {"length": 2**62},
                "length-zero": {"length": 0},
            }[variant]
            storage[first] = dataclasses.replace(info, **change)
        data = pickle.dumps(metadata)
        if variant == "pickle-dict":
            data = pickle.dumps({"state_dict_metadata": {}, "storage_data": {}})
        elif variant == "pickle-gadget":
            data = pickle.dumps(_Gadget())
        elif variant == "metadata-empty":
            data = pickle.dumps(type(metadata)(state_dict_metadata={}))
        elif variant == "truncated":
            data = raw[: len(raw) // 2]
        (out / f"{variant}.metadata").write_bytes(data)


# ---- tables --------------------------------------------------------------------------------------

CELLS: tuple[str, ...] = (
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "",
    " ",
    "abc",
    "9" * 400,
    "1_0",
    "\u0661",
    "True",
    "0x1f",
    "\u2028",
    '"quoted,comma"',
    '"multi\nline"',
    "[/]",
    "-0",
    "5e-324",
    "1e308",
    "NULL",
    "#N/A",
)


def csv_table(g: Gen, *, shift: float = 0.0, columns: list[str] | None = None) -> tuple[str, list[str]]:
    """A CSV with numeric, categorical and hostile columns; the header names are returned for reuse."""
    if columns is None:
        count = g.rng.randint(1, 5)
        columns = [f"c{i}" for i in range(count)]
        if g.chance(0.2):
            columns[g.rng.randrange(count)] = g.pick(("", "c0", "[bold]", "a" * 300, "é", "x,y", " ", "nan"))
            g.note(f"header {columns!r}")
    rows = g.pick((0, 1, 2, 5, 50, 300))
    menu = (
        ("float", "float", "int", "cat", "bool", "const")
        if g.calm
        else ("float", "int", "cat", "bool", "hostile", "const", "nan")
    )
    kinds = [g.pick(menu) for _ in columns]
    ragged = g.chance(0.05)
    lines = [",".join(_csv_cell(c) for c in columns)]
    for _ in range(rows):
        cells = []
        for kind in kinds:
            if kind == "float":
                cells.append(repr(g.rng.gauss(shift, 1)))
            elif kind == "int":
                cells.append(str(g.rng.randint(-5, 5) + int(shift)))
            elif kind == "cat":
                cells.append(g.pick(("a", "b", "c", "d" if shift else "a")))
            elif kind == "bool":
                cells.append(g.pick(("true", "false")))
            elif kind == "const":
                cells.append("7")
            elif kind == "nan":
                cells.append("nan")
            else:
                cells.append(str(g.pick(CELLS)) if g.chance(0.3) else repr(g.rng.gauss(shift, 1)))
        if ragged and g.chance(0.05):
            cells.append("extra")
        lines.append(",".join(cells))
    return "\n".join(lines) + "\n", columns


def _csv_cell(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text


_BOMB: list[bytes] = []


def gzip_bomb() -> bytes:
    """About 1 GiB of CSV (two numeric columns) in about a megabyte of gzip, built once per process."""
    if not _BOMB:
        comp = zlib.compressobj(9, zlib.DEFLATED, 31)
        chunk = b"1,2\n" * (1 << 18)
        parts = [comp.compress(b"x,y\n")]
        parts.extend(comp.compress(chunk) for _ in range(256))
        parts.append(comp.flush())
        _BOMB.append(b"".join(parts))
    return _BOMB[0]


def table_file(g: Gen, stem: str, *, shift: float, columns: list[str] | None) -> tuple[str, list[str] | None]:
    """A table path for ``drift``: CSV, TSV, gzip CSV, Parquet, or something hostile."""
    roll = g.rng.random()
    if roll < 0.08:
        return g.special_input(stem, ".csv", lambda: b"x\n1\n"), None
    if roll < 0.5:
        text, cols = csv_table(g, shift=shift, columns=columns)
        data = text.encode()
        if g.chance(0.1):
            data = mutate_text(g, text)
        return g.add_file(g.name(stem, ".csv"), data), cols
    if roll < 0.58:
        text, cols = csv_table(g, shift=shift, columns=columns)
        return g.add_file(g.name(stem, ".tsv"), text.replace(",", "\t").encode()), cols
    if roll < 0.72:
        text, cols = csv_table(g, shift=shift, columns=columns)
        packed = gzip.compress(text.encode(), mtime=0)
        how = g.pick(("ok", "ok", "truncated", "corrupt", "bomb", "plain"))
        if how != "ok":
            g.note(f"gzip: {how}")
        if how == "truncated":
            packed = packed[: max(1, len(packed) * 2 // 3)]
        elif how == "corrupt":
            packed = packed[:20] + bytes(255 - b for b in packed[20:40]) + packed[40:]
        elif how == "bomb" and g.chance(0.3):
            packed = gzip_bomb()
        elif how == "plain":
            packed = text.encode()
        return g.add_file(g.name(stem, ".csv.gz"), packed), cols
    parquet = g.templates.under("parquet/")
    if not parquet:
        return g.add_file(g.name(stem, ".parquet"), b"PAR1"), None
    name = g.pick(sorted(parquet))
    data = parquet[name]
    how = g.pick(("ok", "ok", "ok", "truncated", "flipped", "as-csv"))
    g.note(f"parquet {name} {how}")
    if how == "truncated":
        data = data[: g.rng.randrange(1, len(data))]
    elif how == "flipped":
        at = g.rng.randrange(len(data))
        data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
    suffix = ".csv" if how == "as-csv" else g.pick((".parquet", ".pq"))
    return g.add_file(g.name(stem, suffix), data), None


# ---- scrapes and GPU logs ------------------------------------------------------------------------

DCGM_METRICS: tuple[str, ...] = (
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_XID_ERRORS",
)
SAMPLE_VALUES: tuple[str, ...] = (
    "NaN",
    "+Inf",
    "-Inf",
    "1e400",
    "-0",
    "5e-324",
    "1_0",
    "sixty",
    "0x10",
    "",
    "9" * 5000,
    "\u0661\u0662",
)


def scrape_text(g: Gen, t_ms: int) -> str:
    lines = []
    gpus = g.rng.randint(1, 4)
    for metric in g.rng.sample(DCGM_METRICS, g.rng.randint(1, 8)):
        lines.append(f"# HELP {metric} help text")
        lines.append(f"# TYPE {metric} gauge")
        for gpu in range(gpus):
            value = repr(round(g.rng.uniform(0, 100), 3))
            labels = f'gpu="{gpu}",UUID="GPU-{gpu}",Hostname="n1",modelName="NVIDIA H100 80GB HBM3"'
            stamp = f" {t_ms}" if g.chance(0.5) else ""
            if g.chance(0.08):
                value = str(g.pick(SAMPLE_VALUES))
            if g.chance(0.05):
                stamp = " " + str(g.pick(("9" * 5000, "-1", "1.5", "1e400", str(2**64), "abc")))
            if g.chance(0.05):
                labels = str(
                    g.pick(
                        (
                            'gpu="0",gpu="1"',
                            'gpu="0",UUID="u\\q"',
                            'gpu="0",note="\\n[bold]x[/]"',
                            "",
                            'gpu="' + "9" * 3000 + '"',
                            'gpu="0",UUID="\udcff"',
                            'gpu="0",',
                            "gpu=0",
                        )
                    )
                )
            lines.append(f"{metric}{{{labels}}} {value}{stamp}")
    if g.chance(0.1):
        lines.append(
            str(g.pick(("# TYPE", "#", "{} 1", "metric_without_value", "x" * 70_000, "\x00\x01", 'm{a="b"} 1 2 3')))
        )
    if g.chance(0.05):
        lines.extend(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="u{i}"}} 1' for i in range(20_000))
        g.note("20,000 series")
    return "\n".join(lines) + "\n"


def scrape_bytes(g: Gen, t_ms: int) -> bytes:
    return scrape_text(g, t_ms).encode("utf-8", "surrogatepass")


def gpu_log(g: Gen, attempt: int, start_ms: int, rounds: int, *, hostile: bool = True) -> bytes:
    """A per-attempt GPU log (``jobs/<id>/gpu/attempt-N.jsonl``), with hostile lines when ``hostile``."""
    labels = {"gpu": "0", "UUID": "GPU-0", "modelName": "NVIDIA H100 80GB HBM3", "hostname": "vm", "hpc_job": "1"}
    metrics = DCGM_METRICS[:8]
    lines: list[str] = [json.dumps({"gpufleet_gpu_log": 1, "source": "synthetic:healthy", "started_ms": start_ms})]
    lines.append(json.dumps({"series": [[i, m, labels] for i, m in enumerate(metrics)]}))
    for r in range(rounds):
        values = [[i, round(g.rng.uniform(0.1, 0.99), 3)] for i in range(len(metrics))]
        lines.append(json.dumps({"t": start_ms + r * 5000 * attempt, "v": values}))
    bad_lines = (
        '{"t": ' + "9" * 5000 + ', "v": []}',
        '{"t": 1e400, "v": [[0, 1]]}',
        '{"t": ' + str(10**30) + ', "v": [[0, 1]]}',
        '{"t": -5, "v": [[0, 1]]}',
        '{"t": 1796000000000, "v": [[0, "NaN"], [1, "+Inf"], [2, "bogus"], [99, 1], [[0], 1], [0]]}',
        '{"series": [[0, "DCGM_FI_DEV_GPU_UTIL", {"gpu": ["x"]}], [1.5, "m", {}], [2, 3, {}], "junk"]}',
        '{"series": [[' + str(2**70) + ', "DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}]]}',
        "[" * 50_000 + "]" * 50_000,
        '{"t": 1796000000000, "v": [[0, ' + "1" * 5000 + "]]}",
        '{"t": 1796000000000, "v": {"0": 1}}',
        "null",
        "not json",
        '{"gpufleet_gpu_log": 1}',
        '{"t": 1796000000000, "v": [[0, 1, 1e400]]}',
        '{"t": 1796000000000, "v": [[0, 1, ' + str(-(10**20)) + "]]}",
        '{"series": [[0, "\\ud800", {"gpu": "\\ud800[/]"}]]}',
    )
    for _ in range(g.rng.randint(0, 3) if hostile and g.chance(0.7) else 0):
        line = str(g.pick(bad_lines))
        lines.insert(g.rng.randrange(1, len(lines) + 1), line)
        g.note(f"gpu log line {line[:60]!r}")
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    if hostile and g.chance(0.05):
        data = data[: g.rng.randrange(1, len(data))]
        g.note("gpu log truncated")
    return data


# ---- a job's runtime files -----------------------------------------------------------------------

EVENT_KINDS: tuple[str, ...] = (
    "session_start",
    "gpu_source",
    "group",
    "restore",
    "checkpoint_skipped",
    "rng_reseeded",
    "config_changed",
    "nothing_to_train",
    "train_start",
    "step",
    "unhealthy",
    "rollback",
    "checkpoint",
    "checkpoint_failed",
    "preempt_signal",
    "metrics",
    "eval",
    "rank_stalled",
    "rank_stall_cleared",
    "session_end",
    "attempt_start",
    "attempt_end",
    "resized",
    "placed",
    "spot_preempted",
    "completed",
    "failed",
)


def realistic_events(g: Gen, attempts: int, steps: int, start: float) -> list[dict[str, Any]]:
    """What a preempted-then-resumed job's runtime writes, attempt by attempt."""
    out: list[dict[str, Any]] = []
    ts = start
    step = 0
    per = max(1, steps // attempts)
    for n in range(1, attempts + 1):
        ts += 2.0
        out.append({"ts": ts, "attempt": n, "kind": "session_start", "pid": 1000 + n, "total_steps": steps})
        out.append({"ts": ts, "attempt": n, "kind": "gpu_source", "source": "synthetic:healthy"})
        out.append({"ts": ts + 0.01, "attempt": n, "kind": "restore", "step": step or None, "seconds": 0.01})
        out.append({"ts": ts + 0.02, "attempt": n, "kind": "train_start", "step": step, "data_position": step})
        for _ in range(per):
            step += 1
            ts += 0.5
            loss = 5.0 / step + g.rng.random() * 0.01
            out.append(
                {
                    "ts": ts,
                    "attempt": n,
                    "kind": "step",
                    "step": step,
                    "loss": loss,
                    "tokens_per_s": 1000.0,
                    "tokens": 512,
                    "data_position": step,
                    "mfu": 0.3,
                }
            )
            if step % 5 == 0:
                out.append(
                    {
                        "ts": ts + 0.01,
                        "attempt": n,
                        "kind": "checkpoint",
                        "step": step,
                        "seconds": 0.01,
                        "bytes": 19000,
                        "healthy": True,
                        "reason": "periodic",
                    }
                )
        if g.chance(0.3):
            out.append({"ts": ts + 0.1, "attempt": n, "kind": "unhealthy", "step": step, "loss": math.nan})
            out.append({"ts": ts + 0.2, "attempt": n, "kind": "rollback", "from_step": step, "to_step": step - 1})
        status = "completed" if n == attempts else "requeue"
        if status == "requeue":
            out.append({"ts": ts + 0.3, "attempt": n, "kind": "preempt_signal", "signal": "SIGTERM", "step": step})
        out.append({"ts": ts + 0.4, "attempt": n, "kind": "session_end", "status": status, "step": step})
    return out


HOSTILE_EVENT_LINES: tuple[str, ...] = (
    "not json",
    "[1, 2, 3]",
    "null",
    '"just a string"',
    "{}",
    '{"kind": 5, "ts": 1, "attempt": 1}',
    '{"kind": "step", "ts": ' + "9" * 400 + ', "attempt": 1}',
    '{"kind": "step", "ts": 1796000100, "attempt": ' + "1" * 31 + "}",
    '{"kind": "step", "ts": 1796000100, "attempt": -1}',
    '{"kind": "step", "ts": 1796000100, "attempt": true}',
    '{"kind": "step", "ts": 1e400, "attempt": 1}',
    '{"kind": "step", "ts": NaN, "attempt": 1}',
    '{"kind": "", "ts": 1796000100, "attempt": 1}',
    '{"kind": "' + "k" * 65 + '", "ts": 1796000100, "attempt": 1}',
    '{"kind": "step", "ts": 1796000100, "attempt": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"kind": "step", "ts": 1796000100, "attempt": 1, "step": ' + "7" * 5000 + "}",
    "\xff\xfe garbage \x00",
    '{"kind": "step", "ts": 1796000100, "attempt": 1, "step": "abc", "loss": "nan"}',
    '{"kind": "step", "ts": 1796000100, "attempt": 1, "step": 1e400, "loss": 1e400}',
    '{"kind": "step", "ts": 1796000100, "attempt": 1, "step": -5, "loss": -Infinity, "tokens": -1}',
    '{"kind": "step", "ts": 1796000100, "attempt": 1, "step": ' + str(10**30) + ', "loss": 1.0}',
    '{"kind": "step", "ts": 1796000100, "attempt": 1, "step": 3, "loss": null, "mfu": "high"}',
    '{"kind": "step", "ts": 1796000100, "attempt": 1, "step": [1], "loss": {"a": 1}}',
    '{"kind": "checkpoint", "ts": 1796000100, "attempt": 1, "step": 5, "seconds": -1, "bytes": "x",'
    ' "path": "../../../etc/passwd"}',
    '{"kind": "checkpoint", "ts": 1796000100, "attempt": 1, "step": 5, "seconds": 1e308, "bytes": 1e308}',
    '{"kind": "attempt_start", "ts": 1796000100, "attempt": 1, "gpus": ' + str(10**30) + ', "world_size": 0}',
    '{"kind": "attempt_start", "ts": 1796000100, "attempt": 1, "gpus": -3, "world_size": "two"}',
    '{"kind": "attempt_start", "ts": 1796000100, "attempt": 1, "gpus": NaN}',
    '{"kind": "resized", "ts": 1796000100, "attempt": null, "before": {"gpus": "x"}, "after": 5}',
    '{"kind": "session_end", "ts": 1796000100, "attempt": 1, "status": "[/]", "error": "\\ud800\\n[bold]"}',
    '{"kind": "session_end", "ts": 1796000100, "attempt": 1, "status": "failed", "error": "CUDA out of memory"}',
    '{"kind": "unhealthy", "ts": 1796000100, "attempt": 1, "step": 2, "loss": "inf", "zscore": "big", "reason": ["x"]}',
    '{"kind": "rollback", "ts": 1796000100, "attempt": 1, "from_step": "a", "to_step": 1e400}',
    '{"kind": "rank_stalled", "ts": 1796000100, "attempt": 1, "ranks": "all", "stalled": [{"rank": "x"}],'
    ' "waiting": 5}',
    '{"kind": "rank_stalled", "ts": 1796000100, "attempt": 1, "ranks": [{"rank": 1e400, "host": null}]}',
    '{"kind": "step", "ts": 1796000100, "attempt": 1, "step": 4, "loss": 0.5, "rank_step_s": {"0": "x"},'
    ' "rank_wait_s": [1e400]}',
    '{"kind": "preempt_signal", "ts": 0, "attempt": 0, "signal": 15}',
    '{"kind": "restore", "ts": 1796000100, "attempt": 1, "step": "\\u0000", "seconds": "fast"}',
    '{"kind": "placed", "ts": 1796000100, "attempt": 1, "offer": {"x": 1}, "price": "free"}',
    '{"kind": "step\\n[bold]", "ts": 1796000100, "attempt": 1}',
    '{"kind": "\\ud800", "ts": 1796000100, "attempt": 1, "\\ud800": "\\udcff"}',
    '{"kind": "eval", "ts": 1796000100, "attempt": 1, "val_loss": ' + "1" * 4400 + "}",
    '{"ts": 1796000100, "attempt": 1, "kind": "step", "ts": 5}',
    '{"kind": "metrics", "ts": 1796000100, "attempt": 1, "' + "k" * 5000 + '": 1}',
    '{"kind": "unhealthy", "ts": 1796000100, "attempt": 1, "step": 3, "loss": 9.5, "reason": "[/]"}',
    '{"kind": "rollback", "ts": 1796000100, "attempt": 1, "from_step": 3, "to_step": 2, "reason": "[bold]x[/]"}',
    '{"kind": "restore", "ts": 1796000100, "attempt": 1, "step": 2, "path": "\\ud800/[/]"}',
    '{"kind": "restore", "ts": 1796000100, "attempt": 1, "step": 2, "path": "\ud800"}',
    '{"kind": "checkpoint_skipped", "ts": 1796000100, "attempt": 1, "step": 2, "problem": "\ud800\u001b[31m"}',
    '{"kind": "preempt_signal", "ts": 1796000100, "attempt": 1, "signal": "[link=x]SIG[/link]", "step": 1}',
    '{"kind": "rank_stalled", "ts": 1796000100, "attempt": 1, "stalled": [{"rank": 1, "host": "[/]",'
    ' "pid": 7, "where": "\ud800"}], "waiting": [0], "seconds": 6}',
    '{"kind": "step", "ts": 1796000100, "attempt": 1, "step": 4, "loss": 0.5, "tokens": 1e308, "tokens_per_s": 1e308}',
    '{"kind": "checkpoint", "ts": 1796000100, "attempt": 1, "step": 5, "seconds": 1e308, "bytes": 1e308,'
    ' "healthy": "yes", "reason": "[/]"}',
)


def events_file(g: Gen, events: list[dict[str, Any]]) -> bytes:
    lines = [json.dumps(e, separators=(",", ":")) for e in events]
    count = g.rng.randint(1, 6) if g.chance(0.85) else 0
    for _ in range(count):
        roll = g.rng.random()
        if roll < 0.7:
            line = str(g.pick(HOSTILE_EVENT_LINES))
        elif roll < 0.85 and events:
            event = dict(g.pick(events))
            key = g.pick(sorted(event))
            event[key] = hostile_value(g)
            line = json.dumps(event, allow_nan=True)
        else:
            line = json.dumps(
                {"ts": T0 + 10, "attempt": 1, "kind": g.pick(EVENT_KINDS), **{g.string()[:20]: hostile_value(g)}}
            )
        lines.insert(g.rng.randrange(len(lines) + 1), line)
        g.note(f"event line {line[:60]!r}")
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    if g.chance(0.05):
        data += b'{"ts": 1796000200, "attempt": 2, "kind": "st'
        g.note("torn last event line")
    if g.chance(0.02):
        step = json.dumps({"ts": T0 + 5, "attempt": 1, "kind": "step", "step": 1, "loss": 1.0, "tokens": 512})
        data += ((step + "\n") * 50_000).encode()
        g.note("50,000 more step events")
    if g.chance(0.03):
        data = b"\xef\xbb\xbf" + data
        g.note("BOM before the events")
    if g.chance(0.03):
        data += b'{"kind": "metrics", "ts": 1796000100, "attempt": 1, "blob": "' + b"z" * (3 << 20) + b'"}\n'
        g.note("a 3 MiB event line")
    return data


def checkpoint_files(g: Gen, *, p_hostile: float = 0.6) -> dict[str, FileContent]:
    """Two checkpoints from the templates, with a hostile manifest, file or folder now and then."""
    ckpt = dict[str, FileContent](g.templates.under("ckpt/"))
    if not ckpt or not g.chance(p_hostile):
        return ckpt
    steps = sorted({name.split("/")[0] for name in ckpt})
    step = g.pick(steps)
    manifest_name = f"{step}/manifest.json"
    raw = ckpt.get(manifest_name)
    manifest: dict[str, Any] = json.loads(raw) if isinstance(raw, bytes) else {}
    op = g.pick(
        (
            "field",
            "field",
            "field",
            "files",
            "bytes",
            "deep",
            "huge-int",
            "not-json",
            "missing",
            "dir",
            "fifo",
            "link-zero",
            "empty",
            "big",
            "extra-step",
            "flip-pt",
            "pt-link",
            "pt-fifo",
            "pt-garbage",
        )
    )
    g.note(f"checkpoint {step}: {op}")
    if op == "field" and manifest:
        key = g.pick([*sorted(manifest), "bogus"])
        manifest[key] = hostile_value(g)
        g.note(f"manifest {key} = {_short(manifest[key])}")
        ckpt[manifest_name] = json.dumps(manifest, allow_nan=True).encode("utf-8", "surrogatepass")
    elif op == "files" and manifest:
        files = dict(manifest.get("files", {}))
        name = g.pick(("../../etc/passwd.pt", "a/b.pt", "", ".hidden.pt", "x" * 300 + ".pt", "__0_0.distcp", "m.pt"))
        files[name] = g.pick(({"sha256": "0" * 64, "bytes": 5}, {"sha256": "zz", "bytes": -1}, [], {"bytes": 2**70}))
        manifest["files"] = files
        g.note(f"manifest file {name!r}")
        ckpt[manifest_name] = json.dumps(manifest).encode()
    elif op == "bytes" and manifest:
        files = manifest.get("files", {})
        for entry in files.values():
            if isinstance(entry, dict):
                entry["bytes"] = g.pick((2**63, 10**30, -1, 0, 1e400 if g.chance(0.5) else 10**400))
        ckpt[manifest_name] = json.dumps(manifest, allow_nan=True).encode()
    elif op == "deep":
        ckpt[manifest_name] = ("[" * 100_000 + "]" * 100_000).encode()
    elif op == "huge-int":
        ckpt[manifest_name] = ('{"schema_version": 1, "step": ' + "9" * 5000 + "}").encode()
    elif op == "not-json":
        ckpt[manifest_name] = hostile_bytes(g)
    elif op == "missing":
        ckpt.pop(manifest_name, None)
    elif op == "dir":
        ckpt[manifest_name] = Special("dir")
    elif op == "fifo":
        ckpt[manifest_name] = Special("fifo")
    elif op == "link-zero":
        ckpt[manifest_name] = Special("symlink", "/dev/zero")
    elif op == "empty":
        ckpt[manifest_name] = b""
    elif op == "big":
        ckpt[manifest_name] = b'{"pad": "' + b"p" * (2 << 20) + b'"}'
    elif op == "extra-step":
        ckpt[g.pick(("step-99999999/manifest.json", "step-00000005", "step-1/manifest.json", "step-00000030"))] = (
            g.pick((b"{}", Special("dir"), Special("fifo"), Special("symlink", "/")))
        )
    else:
        pts = sorted(name for name in ckpt if name.startswith(step) and name.endswith(".pt"))
        if pts:
            target = g.pick(pts)
            original = ckpt[target]
            if op == "flip-pt" and isinstance(original, bytes):
                at = g.rng.randrange(len(original))
                ckpt[target] = original[:at] + bytes([original[at] ^ 0x01]) + original[at + 1 :]
            elif op == "pt-link":
                ckpt[target] = Special("symlink", "/dev/zero")
            elif op == "pt-fifo":
                ckpt[target] = Special("fifo")
            else:
                ckpt[target] = hostile_bytes(g)
    return ckpt


def spec_json(spec: dict[str, Any]) -> str:
    """``spec`` as ``jobs.spec`` and ``spec.json`` hold it (validated by gpufleet itself)."""
    from gpufleet.spec import parse_spec

    return parse_spec(spec).model_dump_json()


def job_spec_for_home(g: Gen) -> dict[str, Any]:
    spec: dict[str, Any] = example("toy.yaml")
    spec["team"] = g.pick(("perception", "planning", "default"))
    spec["resources"] = {
        "gpu_type": g.pick(("A100", "H100", "cpu", "L4", "B200")),
        "gpus": g.pick((0, 1, 2)),
        "cpus": 1,
    }
    if spec["resources"]["gpus"] > 1:
        spec["distributed"] = {"strategy": "ddp"}
    spec["telemetry"] = {"gpu_source": "synthetic:healthy", "sample_seconds": 5.0}
    spec["spot"] = g.chance(0.5)
    if g.chance(0.2):
        odd = dict(spec, resources={**spec["resources"], "gpu_type": g.pick(ODD_GPU_TYPES)})
        try:
            spec_json(odd)
        except Exception:  # noqa: BLE001 - gpufleet refuses that GPU type: keep the plain one
            pass
        else:
            spec = odd
            g.note(f"gpu_type {spec['resources']['gpu_type'][:30]!r}")
    return spec


ODD_GPU_TYPES: tuple[str, ...] = ("[/]", "[bold]A100", "a\nb", "\u202eevil", "x" * 300, "\x1b[31mH100", "{0}", "é", "")


def template_job(g: Gen, *, hostile: bool) -> HomeJob:
    """A job that was preempted once and resumed (or one in another state), with its runtime files."""
    spec = job_spec_for_home(g)
    attempts = g.pick((1, 2, 2, 3))
    steps = g.pick((10, 20, 30))
    state = g.pick(("completed", "completed", "running", "queued", "failed", "cancelled", "preempted"))
    events = realistic_events(g, attempts, steps, T0)
    rows: list[tuple[Any, ...]] = []
    db_events: list[tuple[Any, Any, Any, Any, Any]] = [(None, T0, "queued", "backend", '{"priority": 0}')]
    t = T0 + 1
    for n in range(1, attempts + 1):
        last = n == attempts
        ended = None if (last and state in ("running", "queued")) else t + 30
        outcome = None if ended is None else ("completed" if last else "preempted")
        code = None if ended is None else (0 if last else 75)
        rows.append((n, "running" if ended is None else "ended", 1000 + n, t, ended, code, outcome))
        gpus = spec["resources"]["gpus"]
        db_events.append((n, t, "attempt_start", "backend", json.dumps({"pid": 1000 + n, "gpus": gpus})))
        if ended is not None:
            db_events.append((n, ended, "attempt_end", "backend", json.dumps({"exit_code": code, "outcome": outcome})))
        t += 31
    job = HomeJob(
        spec=spec,
        name=spec["name"],
        team=spec["team"],
        state=state if state != "preempted" else "queued",
        attempts=rows,
        db_events=db_events,
        restarts=attempts - 1,
    )
    job.events_jsonl = events_file(g, events) if hostile else ("\n".join(json.dumps(e) for e in events) + "\n").encode()
    job.files = {f"logs/attempt-{n}.log": f"attempt {n} log line\n".encode() for n in range(1, attempts + 1)}
    for n in range(1, attempts + 1):
        job.files[f"gpu/attempt-{n}.jsonl"] = gpu_log(g, n, int((T0 + 1 + 31 * (n - 1)) * 1000), 8, hostile=hostile)
    job.files["spec.json"] = json.dumps(json.loads(spec_json(spec)), indent=2).encode()
    for name, content in checkpoint_files(g, p_hostile=0.3 if hostile else 0.0).items():
        job.files[f"checkpoints/{name}"] = content
    if g.chance(0.15):
        job.backend = g.pick(("slurm", "ray"))
        job.backend_ref = "12345"
        job.state = "running"
        g.note(f"a {job.backend} job that is running")
    return job


def hostile_job_files(g: Gen, job: HomeJob) -> None:
    """Replace one of the job's runtime files by something hostile."""
    what = g.pick(("log", "log", "gpu", "gpu", "spec", "events"))
    if what == "log":
        name = g.pick(sorted(n for n in job.files if n.startswith("logs/")) or ["logs/attempt-1.log"])
        job.files[name] = g.pick(
            (
                Special("symlink", "/dev/zero"),
                Special("fifo"),
                Special("dir"),
                b"\xff\xfe\x00binary\x1b[31m[/]\n",
                b"x" * (8 << 20),
                "\ud800 surrogate".encode("utf-8", "surrogatepass"),
            )
        )
        g.note(f"{name}: {_preview(job.files[name], 30)}")
    elif what == "gpu":
        name = g.pick(sorted(n for n in job.files if n.startswith("gpu/")) or ["gpu/attempt-1.jsonl"])
        job.files[name] = g.pick((Special("symlink", "/dev/zero"), Special("fifo"), Special("dir"), hostile_bytes(g)))
        if g.chance(0.3):
            job.files["gpu/attempt-999999999999999999999.jsonl"] = b"{}\n"
        g.note(f"{name}: {_preview(job.files[name], 30)}")
    elif what == "spec":
        job.files["spec.json"] = g.pick(
            (b"{", b"[]", b'{"name": 5}', Special("dir"), Special("fifo"), Special("symlink", "/dev/zero"))
        )
        g.note(f"spec.json: {_preview(job.files['spec.json'], 30)}")
    else:
        job.events_jsonl = g.pick((Special("symlink", "/dev/zero"), Special("fifo"), Special("dir"), b"\x00" * 100))
        job.ingest = False
        g.note(f"events.jsonl: {_preview(job.events_jsonl, 30)}")


def hostile_db_job(g: Gen, job: HomeJob) -> None:
    """Corrupt the job's own rows in ``state.db`` (what a bad migration or a hand edit leaves)."""
    what = g.pick(("state", "spec", "env", "offset", "attempt", "event", "name", "times", "priority", "backend"))
    if what == "state":
        job.state = g.pick(("bogus", "", "RUNNING", "[/]"))
    elif what == "spec":
        job.raw_spec = g.pick(("{", "[]", "null", '{"name": "x"}', "9" * 5000, '{"name": "\\ud800"}'))
    elif what == "env":
        job.env_text = g.pick(("{", "[1]", "null", '{"A": 5}'))
    elif what == "offset":
        job.events_offset = g.pick((-1, 2**62, 10**18))
        job.ingest = False
    elif what == "attempt" and job.attempts:
        n, state, pid, started, ended, code, outcome = job.attempts[0]
        job.attempts[0] = (
            n,
            g.pick((state, "bogus")),
            g.pick((pid, -1, 2**62, None)),
            g.pick((started, "abc", 1e308, -1e308, "")),  # the column is NOT NULL: a real store never holds None
            g.pick((ended, "yesterday", started - 100 if isinstance(started, float) else 0.0)),
            g.pick((code, 2**62, -9, "x")),
            g.pick((outcome, "bogus", "[bold]")),
        )
    elif what == "event":
        job.db_events.append(
            g.pick(
                (
                    (1, T0 + 5, "attempt_start", "backend", "{"),
                    (1, T0 + 5, "attempt_start", "backend", "[1, 2]"),
                    (1, T0 + 5, "attempt_start", "backend", '{"gpus": "x"}'),
                    (1, "soon", "step", "runtime", '{"step": 1}'),
                    ("one", T0 + 5, "step", "runtime", '{"step": 1, "loss": "Infinity"}'),
                    (1, T0 + 5, "resized", "backend", '{"before": {"gpus": -1}, "after": {"gpus": 1e999}}'),
                    (1, T0 + 5, "step", "runtime", '{"step": 1, "loss": NaN, "tokens": 1e999}'),
                )
            )
        )
    elif what == "name":
        job.name = g.pick(("\u202eevil", "[/]", "a\nb", "x" * 5000))
    elif what == "times":
        job.submitted_at = g.pick((1e308, -1e308, "abc", 0.0))
    elif what == "priority":
        job.priority = g.pick((2**63 - 1, -(2**63), "high"))
    else:
        job.backend = g.pick(("bogus", "", "slurm"))
        job.backend_ref = g.pick((None, "not-a-number", "1;rm -rf /"))
    g.note(f"state.db: job {what} corrupted")


def materialize_home(recipe: HomeRecipe, home: Path) -> list[str]:
    """Write ``recipe`` under ``home`` the way gpufleet and its jobs would have (deterministic).

    Returns what went wrong in gpufleet's own code on the way: ``ingest_events``, the scheduler's
    reading of ``events.jsonl``, must take any line (it is written by user code) without raising.
    """
    problems: list[str] = []
    from gpufleet.backends.base import ingest_events
    from gpufleet.jobs.store import Store
    from gpufleet.paths import state_db

    if recipe.jobs:
        store = Store(state_db(home))
        store.close()
        db = sqlite3.connect(state_db(home), isolation_level=None)
        try:
            for job_id, job in enumerate(recipe.jobs, start=1):
                spec = job.raw_spec if job.raw_spec is not None else spec_json(job.spec or {})
                db.execute(
                    "INSERT INTO jobs (id, name, team, priority, backend, state, spec, submitted_at, updated_at,"
                    " restarts, reason, env, events_offset, backend_ref) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        job_id,
                        job.name,
                        job.team,
                        job.priority,
                        job.backend,
                        job.state,
                        spec,
                        job.submitted_at,
                        job.updated_at,
                        job.restarts,
                        job.reason,
                        job.env_text,
                        job.events_offset,
                        job.backend_ref,
                    ),
                )
                for row in job.attempts:
                    db.execute(
                        "INSERT INTO attempts (job_id, n, state, pid, started_at, ended_at, exit_code, outcome)"
                        " VALUES (?,?,?,?,?,?,?,?)",
                        (job_id, *row),
                    )
                for attempt, ts, kind, source, data in job.db_events:
                    db.execute(
                        "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?,?,?,?,?,?)",
                        (job_id, attempt, ts, kind, source, data),
                    )
        finally:
            db.close()
        for job_id, job in enumerate(recipe.jobs, start=1):
            folder = home / "jobs" / str(job_id)
            folder.mkdir(parents=True, exist_ok=True)
            if job.events_jsonl is not None:
                write_file(folder / "events.jsonl", job.events_jsonl)
            for name, content in job.files.items():
                write_file(folder / name, content)
        for job_id, job in enumerate(recipe.jobs, start=1):
            if job.ingest and isinstance(job.events_jsonl, bytes):
                store = Store(state_db(home))
                try:
                    loaded = store.job(job_id)
                except Exception:  # noqa: BLE001 - a row corrupted on purpose: the scheduler would not get here
                    store.close()
                    continue
                try:
                    ingest_events(store, home, loaded)
                except Exception as err:  # noqa: BLE001 - the scheduler's ingest must survive any line
                    problems.append(f"ingest_events of job {job_id} raised {type(err).__name__}: {err}"[:300])
                finally:
                    store.close()
    for name, content in recipe.files.items():
        target = home / name
        for stale in (target, target.with_name(target.name + "-wal"), target.with_name(target.name + "-shm")):
            if stale.is_symlink() or stale.is_file():
                stale.unlink()
        write_file(target, content)
    return problems


def write_file(path: Path, content: FileContent) -> None:
    """Create ``path`` (and its parents) as a file, folder, FIFO or link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content.kind == "dir":
        path.mkdir(exist_ok=True)
    elif content.kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(content.target, path)


# ---- the surfaces --------------------------------------------------------------------------------


@dataclass
class Draft:
    """What a surface generator returns; ``make_case`` adds the files and notes the ``Gen`` collected."""

    argv: list[str]
    home: HomeRecipe | None = None
    target: str = "cli"
    serves: str | None = None
    serves_path: str = "/metrics"
    service_exit_ok: bool = False
    http: list[HttpStep] | None = None
    private: tuple[str, ...] = ()
    must_refuse: bool = False
    quiet: bool = False


def _maybe(g: Gen, p: float, *args: str) -> list[str]:
    return list(args) if g.chance(p) else []


def _home(g: Gen, *, hostile: bool = True, p_empty: float = 0.15) -> HomeRecipe | None:
    if g.chance(p_empty):
        return None
    jobs = [template_job(g, hostile=hostile)]
    if g.chance(0.2):
        jobs.append(template_job(g, hostile=False))
    return HomeRecipe(jobs=jobs)


def spec_path(g: Gen, *, base: dict[str, Any] | None = None) -> str:
    spec = base if base is not None else valid_spec(g)
    return g.input_path("spec", ".yaml", lambda: yaml_doc(g, spec))


def catalog_path(g: Gen, *, hostile: bool) -> str:
    if not hostile:
        return g.add_file("catalog.yaml", (EXAMPLES / "catalog.yaml").read_bytes())
    return g.input_path("catalog", ".yaml", lambda: yaml_doc(g, example("catalog.yaml")))


def surface_spec_submit(g: Gen) -> Draft:
    command = g.pick(("submit", "submit", "submit", "validate"))
    argv = [command, spec_path(g)]
    service = False
    if command == "submit" and g.chance(0.15):
        argv.append("--dry-run")
    if command == "submit" and g.chance(0.3):
        argv += [
            "--gpu-source",
            g.arg_string(
                "auto",
                "none",
                "nvml",
                "synthetic:healthy",
                "synthetic:bogus",
                "synthetic:",
                "scrape:",
                "scrape:http://127.0.0.1:1/metrics",
                "scrape:http://a\nb",
                "scrape:ftp://node/metrics",
                "scrape:http://[::1]:99999/metrics",
                "dcgm:x",
            ),
        ]
    if g.chance(0.2):
        backend = g.arg_string("local", "slurm", "ray", "LOCAL", "fake")
        service = backend in ("slurm", "ray")
        argv += ["--backend", backend]
    argv += _maybe(g, 0.3, "--json")
    if g.chance(0.15):
        g.env["GPUFLEET_LOCAL_SLOTS"] = sanitize_argv(g.number_text("1", "2", "4"))
        g.note(f"GPUFLEET_LOCAL_SLOTS={g.env['GPUFLEET_LOCAL_SLOTS'][:20]!r}")
    if g.chance(0.1):
        g.env["GPUFLEET_SCHEDULER_IDLE_S"] = sanitize_argv(g.number_text("10"))
        g.note(f"GPUFLEET_SCHEDULER_IDLE_S={g.env['GPUFLEET_SCHEDULER_IDLE_S'][:20]!r}")
    return Draft(argv, home=_home(g, hostile=False, p_empty=0.6), service_exit_ok=service)


def surface_spec_export(g: Gen) -> Draft:
    if g.chance(0.5):
        argv = ["export", "skypilot", spec_path(g)]
        if g.chance(0.3):
            argv += ["--bucket", g.arg_string("s3://team-ckpt", "gs://b", "s3://", "file:///etc", "s3://a b")]
        if g.chance(0.2):
            argv += ["--workdir", g.pick((".", "nope", "/dev/null", "a" * 300)) if g.chance(0.7) else spec_path(g)]
        for _ in range(g.rng.randint(0, 2)):
            argv += ["--infra", g.arg_string("coreweave=k8s/cw", "aws=aws", "=x", "x=", "a=b=c", "noequals")]
        if g.chance(0.2):
            argv += ["--requirement", g.arg_string("gpufleet==0.1.0", "gpufleet")]
    else:
        # a job of the batch example: its team and GPU type have quotas in the example catalogue
        spec = dict(g.pick(example("batch.yaml")["jobs"])) if g.chance(0.7) else valid_spec(g)
        argv = ["export", "kueue", spec_path(g, base=spec), "--catalog", catalog_path(g, hostile=g.chance(0.3))]
        for flag in ("--namespace", "--image", "--checkpoint-claim"):
            if g.chance(0.25):
                argv += [flag, g.arg_string("default", "team-a", "ghcr.io/x/y:1", "ckpt-claim")]
    if g.chance(0.3):
        argv += ["--out", g.out_path("export", ".yaml")]
    argv += _maybe(g, 0.3, "--json")
    return Draft(argv)


RUN_ENTRYPOINTS: tuple[Any, ...] = (
    "gpufleet.workloads.toy:train",
    "gpufleet.workloads.toy:train",
    "gpufleet.workloads.toy:train",
    "gpufleet.workloads.toy:nope",
    "no.such.module:train",
    "gpufleet.workloads.toy",
    "os:getcwd",
    "builtins:print",
    "python train.py",
    ["python", "-c", "pass"],
    ":",
    "gpufleet.workloads.toy:",
)
RUN_ARGS: tuple[dict[str, Any], ...] = (
    {"steps": 3, "step_seconds": 0},
    {"steps": 3, "step_seconds": 0},
    {},
    {"step_seconds": 0},
    {"seed": 2**70, "step_seconds": 0},
    {"seed": -1, "step_seconds": 0},
    {"step_seconds": 0, "bogus": 1},
    {"steps": "3", "step_seconds": 0},
    {"step_seconds": -1},
    {"step_seconds": math.nan},
    {"step_seconds": 0, "seed": "0"},
)


def run_spec(g: Gen) -> dict[str, Any]:
    """A spec for the commands that train in-process: mutated anywhere but its entrypoint and args."""
    spec: Any = example("toy.yaml")
    if g.chance(0.6):
        spec = mutate_tree(g, spec, [])  # a raw-YAML mutation stays a harmless marker string here
    if not isinstance(spec, dict):
        return {"name": "toy", "entrypoint": RUN_ENTRYPOINTS[0], "args": {"step_seconds": 0}, "resources": spec}
    spec["entrypoint"] = g.pick(RUN_ENTRYPOINTS)
    spec["args"] = dict(g.pick(RUN_ARGS))
    spec.pop("workdir", None)
    return spec


def surface_spec_run(g: Gen) -> Draft:
    which = g.pick(("determinism", "profile", "resume-check", "resume-check"))
    if which == "resume-check":
        # Never a valid run: every case here is refused before the first attempt starts.
        if g.chance(0.4):
            spec = g.input_path("spec", ".yaml", lambda: g.pick((yaml_bomb(g), hostile_bytes(g))), p_special=0.3)
            return Draft(["debug", "resume-check", spec])
        spec = g.add_file(g.name("spec", ".yaml"), dump_yaml(run_spec(g)).encode())
        refusal = g.pick(
            (
                ["--at", g.pick(("0", "-3", str(-(2**64))))],
                ["--rollback-at", g.pick(("0", "-1"))],
                ["--steps", g.pick(("0", "-5"))],
                ["--keep", g.add_file(g.name("keep", ".txt"), b"a file")],
                ["--keep", g.add_file(g.name("keepdir", "") + "/inside", b"x").rsplit("/", 1)[0]],
                ["--at", g.pick(("abc", "1.5", "", "nan"))],
            )
        )
        g.note(f"resume-check refused by {refusal[0]}")
        return Draft(["debug", "resume-check", spec, *refusal])
    spec_file = g.input_path("spec", ".yaml", lambda: dump_yaml(run_spec(g)).encode(), p_special=0.1)
    if which == "determinism":
        argv = ["debug", "determinism", spec_file, "--steps", g.number_text("1", "2", "3", p_valid=0.7)]
        steps = argv[-1]
        if not _small_int(steps):
            argv[-1] = g.pick(("0", "-1", "abc", "1.5", "", "nan"))
        if g.chance(0.4):
            argv += ["--seeds", g.arg_string("0,1", "5,6", "a,b", "1,2,3", "-1,0", str(2**64) + ",1", ",", "0, 1")]
        if g.chance(0.2):
            argv += ["--plot", g.out_path("losses", ".png")]
    else:
        argv = ["profile", spec_file]
        for flag, ok in (("--steps", ("1", "2")), ("--warmup", ("0", "1")), ("--top", ("1", "5"))):
            value = g.number_text(*ok, p_valid=0.7)
            if not _small_int(value) or int(value) > 3:
                value = g.pick(("0", "-1", "abc", "", "nan")) if flag != "--warmup" else g.pick(("-1", "x"))
            argv += [flag, value]
    argv += _maybe(g, 0.3, "--json")
    return Draft(argv)


def _small_int(text: str) -> bool:
    return text.isascii() and text.isdigit() and 0 < len(text) < 3 and int(text) <= 3


def surface_batch_place(g: Gen) -> Draft:
    base: Any = example("batch.yaml")
    if g.chance(0.3):
        base = base["jobs"]
    argv = [
        "place",
        g.input_path("batch", ".yaml", lambda: yaml_doc(g, base)),
        "--catalog",
        catalog_path(g, hostile=False),
    ]
    for _ in range(g.rng.randint(0, 2)):
        argv += ["--block", g.arg_string("aws", "aws/us-east-1", "aws/us-east-1/H100", "gcp", "a/b/c/d", "/", "*")]
    argv += _maybe(g, 0.3, "--explain") + _maybe(g, 0.3, "--json")
    return Draft(argv)


def surface_catalog(g: Gen) -> Draft:
    catalog = catalog_path(g, hostile=True)
    roll = g.rng.random()
    if roll < 0.5:
        batch = g.add_file("batch.yaml", (EXAMPLES / "batch.yaml").read_bytes())
        argv = ["place", batch, "--catalog", catalog, *_maybe(g, 0.4, "--explain"), *_maybe(g, 0.3, "--json")]
    elif roll < 0.8:
        argv = ["simulate", "--catalog", catalog, "--jobs", str(g.pick((5, 20, 50))), "--days", "1", "--json"]
    else:
        toy = g.add_file("toy.yaml", (EXAMPLES / "toy.yaml").read_bytes())
        argv = ["export", "kueue", toy, "--catalog", catalog]
    return Draft(argv)


def surface_workload(g: Gen) -> Draft:
    argv = ["simulate", "--catalog", catalog_path(g, hostile=False)]
    if g.chance(0.8):
        argv += ["--workload", g.input_path("workload", ".yaml", lambda: yaml_doc(g, WORKLOAD_FULL))]
    jobs = g.number_text(5, 20, 100, p_valid=0.6)
    if jobs.isascii() and jobs.isdigit() and len(jobs) < 30 and 200 < int(jobs) <= 1_000_000:
        jobs = g.pick(("1000001", str(10**30), "0"))  # a valid but long run is not the point here
    argv += ["--jobs", jobs]
    if g.chance(0.6):
        argv += ["--days", g.number_text("0.5", "1", "7", p_valid=0.5)]
    else:
        argv += ["--days", "1"]
    for _ in range(g.rng.randint(0, 2)):
        argv += ["--policy", g.arg_string("cheapest", "on_demand", "ordered", "spot_failover")]
    if g.chance(0.3):
        argv += ["--seed", g.number_text("0", "7")]
    if g.chance(0.15):
        argv += ["--out", g.out_path("sim", "")]
    argv += _maybe(g, 0.5, "--json")
    return Draft(argv)


def surface_rates(g: Gen) -> Draft:
    rates = g.input_path("rates", ".yaml", lambda: yaml_doc(g, rate_card()))
    if g.chance(0.6):
        argv = ["cost", "--rates", rates]
        if g.chance(0.2):
            argv += ["--team", g.arg_string("perception", "planning")]
        if g.chance(0.2):
            argv += ["--job", g.number_text("1", "2")]
        if g.chance(0.15):
            argv += ["--out", g.out_path("note", "")]
    else:
        argv = ["observe", "report", "--rates", rates]
    argv += _maybe(g, 0.4, "--json")
    return Draft(argv, home=_home(g, hostile=False, p_empty=0.3))


def surface_fleet(g: Gen) -> Draft:
    fleet = example("fleet.yaml")
    if g.chance(0.4):
        switches = fleet["switches"]
        victim = g.pick(switches)
        key = "nodes" if victim.get("level") == "leaf" else "children"
        victim[key] = g.pick(HOSTLISTS)
        g.note(f"hostlist {victim[key][:40]!r}")
        if g.chance(0.7):
            return Draft(["slurm", "topology", g.add_file("fleet.yaml", dump_yaml(fleet).encode())])
    return Draft(["slurm", "topology", g.input_path("fleet", ".yaml", lambda: yaml_doc(g, fleet))])


SINCE_VALUES: tuple[str, ...] = (
    "90m",
    "24h",
    "7d",
    "2026-11-01",
    "2026-11-01T00:00:00+02:00",
    "0m",
    "-5m",
    "1e400d",
    "99999999999d",
    "nan h",
    "nand",
    "infd",
    "2026-13-45",
    "9999-12-31T23:59:59",
    "0001-01-01",
    "0002-01-01",
    "1970-01-01",
    "2100-01-01",
    "1.5h",
    "1_0h",
    "\u0661\u0662h",
    "h",
    "",
    "{since}",
)


def surface_slo(g: Gen) -> Draft:
    argv = ["observe", "report", "--slo", g.input_path("slo", ".yaml", lambda: yaml_doc(g, SLO_FULL))]
    if g.chance(0.3):
        argv += ["--since", g.arg_string(*SINCE_VALUES, p_valid=0.8)]
    if g.chance(0.2):
        argv += ["--team", g.arg_string("perception")]
    argv += _maybe(g, 0.3, "--fail-on-breach") + _maybe(g, 0.4, "--json")
    if g.chance(0.1):
        argv += ["--out", g.out_path("report", "")]
    return Draft(argv, home=_home(g, hostile=False, p_empty=0.3))


COUNTS: tuple[str, ...] = (
    "7B",
    "6.74e9",
    "350M",
    "125k",
    "1e15",
    "1.0000001e15",
    "1e16",
    "0",
    "-7B",
    "7 B",
    "7b",
    "7BB",
    "1e400",
    "nan",
    "inf",
    "",
    ".5",
    "5.",
    "1e-9",
    "0.4",
    "7T",
    "\u0661B",
    "1_000",
    "0x10",
)
GPU_NAMES: tuple[str, ...] = ("h100", "a100-40gb", "l4", "H100", "h200", "rtx-4090", "b200", "", "h100 ", "[bold]")


def _int_opt(g: Gen, *valid: int) -> str:
    return g.number_text(*valid, p_valid=0.75)


def surface_estimate(g: Gen) -> Draft:
    which = g.pick(("mfu", "memory", "layout"))

    def count() -> str:
        return g.arg_string(*COUNTS[:6], p_valid=0.6)

    if which == "mfu":
        argv = ["estimate", "mfu", "--params", count(), "--layers", _int_opt(g, 32, 2), "--heads", _int_opt(g, 32, 8)]
        argv += [
            "--head-dim",
            _int_opt(g, 128, 64),
            "--seq",
            _int_opt(g, 2048, 4096),
            "--gpu",
            g.arg_string(*GPU_NAMES),
        ]
        if g.chance(0.8):
            argv += ["--tokens-per-second", g.number_text("1e4", "3e5", "1")]
        if g.chance(0.3):
            argv += ["--step-time", g.number_text("0.5", "2")]
        if g.chance(0.3):
            argv += ["--tokens-per-step", count()]
        if g.chance(0.2):
            argv += ["--num-gpus", _int_opt(g, 8, 1)]
        if g.chance(0.2):
            argv += ["--embedding-params", count()]
        if g.chance(0.2):
            argv += ["--recompute", g.arg_string("none", "selective", "full")]
        if g.chance(0.2):
            argv += ["--dtype", g.arg_string("bf16", "fp16", "tf32", "fp32")]
    else:
        argv = ["estimate", which, "--params", count(), "--gpus", _int_opt(g, 8, 64, 1)]
        if which == "layout" or g.chance(0.3):
            argv += ["--gpu", g.arg_string(*GPU_NAMES)]
        if g.chance(0.5):
            for flag, ok in (
                ("--layers", 32),
                ("--hidden", 4096),
                ("--heads", 32),
                ("--seq", 2048),
                ("--micro-batch", 1),
            ):
                if g.chance(0.9):
                    argv += [flag, _int_opt(g, ok)]
        if g.chance(0.3):
            argv += ["--gpus-per-node", _int_opt(g, 8, 4)]
        if g.chance(0.2):
            argv += ["--expert-params", count(), "--ep", _int_opt(g, 1, 2)]
        if g.chance(0.2):
            argv += ["--recompute", g.arg_string("none", "selective", "full")]
        if g.chance(0.2):
            argv += ["--precision", g.arg_string("mixed", "fp32")]
        argv += _maybe(g, 0.15, "--sequence-parallel")
        if which == "memory":
            if g.chance(0.4):
                argv += [
                    "--strategy",
                    g.arg_string("ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp_grad_op", "fsdp_hybrid"),
                ]
            for flag, ok in (("--tp", 2), ("--pp", 2), ("--micro-batches", 4), ("--virtual-stages", 2)):
                if g.chance(0.25):
                    argv += [flag, _int_opt(g, ok, 1)]
            if g.chance(0.2):
                argv += ["--offload", g.arg_string("none", "optimizer", "params")]
            if g.chance(0.15):
                argv += ["--largest-layer-params", count()]
        else:
            if g.chance(0.3):
                argv += ["--headroom", g.number_text("0.1", "0", "0.5")]
            if g.chance(0.3):
                argv += ["--reserve-gib", g.number_text("1", "0")]
            if g.chance(0.3):
                argv += ["--top", _int_opt(g, 0, 12)]
    argv += _maybe(g, 0.3, "--json")
    return Draft(argv)


SIZES: tuple[str, ...] = ("2e9", "2GB", "2GiB", "512MiB", "8", "1e15", "1 kB", "1.5e3")
BAD_SIZES: tuple[str, ...] = (
    "0",
    "-2GB",
    "0.4",
    "1.0000001e15",
    "1e400",
    "nan",
    "inf",
    "2iB",
    "2GiBB",
    "2 parsecs",
    "\u0662GB",
    "1e-9",
    "",
)
NODE_LISTS: tuple[str, ...] = (
    "gpu[01-08]",
    "gpu[01-16]",
    "gpu[01-04]",
    "gpu[03-06]",
    "l40s[1-4]",
    "gpu[01-07],l40s1",
    "gpu[01-07],gpu99",
    "gpu01,gpu01",
    "gpu[16-01]",
    "",
)


def surface_estimate_allreduce(g: Gen) -> Draft:
    """``gpufleet estimate allreduce``, and ``estimate layout`` on a network: sizes, placements, fleet files."""
    network: list[str] = []
    roll = g.rng.random()
    if roll < 0.5:
        fleet = example("fleet.yaml")
        if g.chance(0.3):
            victim = g.pick(fleet["switches"])
            key = g.pick(("latency_us", "hop_latency_ns"))
            victim["link"] = {**victim["link"], key: g.pick((0, 1.5, 150, *EDGE_FLOATS, *EDGE_INTS[:4], "x", None))}
            g.note(f"{victim['name']}.link.{key} = {victim['link'][key]!r}")
        network += ["--fleet", g.input_path("fleet", ".yaml", lambda: yaml_doc(g, fleet, valid_share=0.7))]
        if g.chance(0.9):
            nodes = g.arg_string(*NODE_LISTS, p_valid=0.85) if g.chance(0.85) else g.pick(HOSTLISTS)
            network += ["--nodes", nodes]
    elif roll < 0.85:
        if g.chance(0.6):
            network += ["--fabric", g.arg_string("infiniband", "roce", "ethernet", p_valid=0.8)]
        if g.chance(0.6):
            network += ["--gbps", g.number_text("400", "200", "100", "25")]
    if g.chance(0.15):
        network += ["--node-gbps", g.number_text("3200", "1600", "400")]
    if g.chance(0.8):
        size = g.arg_string(*SIZES, p_valid=0.8) if g.chance(0.85) else g.pick(BAD_SIZES)
        argv = ["estimate", "allreduce", "--bytes", size, "--gpus", _int_opt(g, 64, 32, 16, 8)]
        if g.chance(0.4):
            argv += ["--gpus-per-node", _int_opt(g, 8, 4, 1)]
        if g.chance(0.4):
            argv += ["--gpu", g.arg_string(*GPU_NAMES)]
    else:
        argv = ["estimate", "layout", "--params", g.arg_string(*COUNTS[:6], p_valid=0.7)]
        argv += ["--gpus", _int_opt(g, 64, 32, 16), "--gpu", g.arg_string(*GPU_NAMES, p_valid=0.8)]
        if g.chance(0.3):
            argv += ["--step-seconds", g.number_text("2", "0.5")]
        if g.chance(0.3):
            argv += ["--top", _int_opt(g, 0, 5)]
    argv += network + _maybe(g, 0.3, "--json")
    return Draft(argv)


METHODS: tuple[str, ...] = ("ks", "chi2", "z", "psi", "wasserstein", "wasserstein_raw", "jensenshannon", "mmd")


def surface_drift(g: Gen) -> Draft:
    ref, cols = table_file(g, "ref", shift=0.0, columns=None)
    cur, _ = table_file(g, "cur", shift=g.pick((0.0, 0.5, 3.0)), columns=cols if g.chance(0.8) else None)
    argv = ["drift", ref, cur]
    if g.chance(0.2):
        argv += ["--columns", g.arg_string("c0", "c0,c1", ",", "c9", " , ")]
    for _ in range(g.rng.randint(0, 2)):
        argv += ["--method", g.arg_string(*METHODS, "c0=ks", "c1=psi", "=ks", "c0=", "c0=bogus", "c9=ks")]
    for _ in range(g.rng.randint(0, 2)):
        argv += ["--threshold", g.arg_string("0.05", "0.1", "c0=0.5", "c0=nan", "nan", "inf", "-1", "c0=")]
    if g.chance(0.2):
        argv += ["--correction", g.arg_string("none", "bh")]
    if g.chance(0.2):
        argv += ["--max-non-finite", g.number_text("0", "1", "0.5")]
    if g.chance(0.1):
        argv += ["--html", g.out_path("drift", ".html")]
    argv += _maybe(g, 0.2, "--fail-on-drift") + _maybe(g, 0.4, "--json")
    return Draft(argv)


def surface_scrape(g: Gen) -> Draft:
    if g.chance(0.3):
        argv = [
            "observe",
            "diagnose",
            "--pattern",
            g.arg_string("healthy", "comm_bound", "oom_risk", "idle", p_valid=0.7),
        ]
        minutes = g.number_text("1", "0.5", "5", "1/60", p_valid=0.6)
        argv += ["--minutes", minutes, "--gpus", _int_opt(g, 1, 8, 2)]
        if g.chance(0.3):
            argv += ["--seed", g.number_text("0", "3")]
    else:
        argv = ["observe", "diagnose"]
        start = int(T0 * 1000)
        for i in range(g.rng.randint(1, 4)):
            argv.append(g.input_path("scrape", ".prom", functools.partial(scrape_bytes, g, start + i * 60_000)))
    if g.chance(0.3):
        argv += ["--precision", g.arg_string("bf16", "fp16", "fp8", "fp32", "tf32")]
    argv += _maybe(g, 0.4, "--json")
    return Draft(argv)


def surface_gpu_log(g: Gen) -> Draft:
    job = template_job(g, hostile=True)
    if g.chance(0.4):
        hostile_job_files(g, job)
    if g.chance(0.7):
        argv = ["diagnose", "1"]
        if g.chance(0.6):
            argv += ["--window", g.number_text("1", "5", "60"), "--min-duration", g.number_text("1", "10", "300")]
    else:
        argv = ["observe", "report"]
    argv += _maybe(g, 0.4, "--json")
    return Draft(argv, home=HomeRecipe(jobs=[job]))


def surface_job_events(g: Gen) -> Draft:
    job = template_job(g, hostile=True)
    if g.chance(0.35):
        hostile_job_files(g, job)
    recipe = HomeRecipe(jobs=[job])
    cmd = g.pick(("show", "logs", "cost", "trace", "diagnose", "spikes", "spikes", "report", "jobs", "advise"))
    if cmd == "show":
        argv = ["show", "1"]
    elif cmd == "advise":
        argv = ["advise", "1"]
        if g.chance(0.4):
            argv += ["--preemptions-per-hour", g.number_text("0.5", "3")]
    elif cmd == "logs":
        argv = ["logs", "1", *(["--attempt", _int_opt(g, 1, 2)] if g.chance(0.4) else [])]
    elif cmd == "cost":
        argv = [
            "cost",
            *(["--job", "1"] if g.chance(0.3) else []),
            *(["--out", g.out_path("note", "")] if g.chance(0.2) else []),
        ]
    elif cmd == "trace":
        argv = ["trace", "1"]
    elif cmd == "diagnose":
        argv = ["diagnose", "1", "--window", "1", "--min-duration", "1"]
    elif cmd == "spikes":
        where = g.pick(("1", f"{HOME_MARK}/jobs/1", f"{HOME_MARK}/jobs/1/events.jsonl"))
        argv = ["debug", "spikes", where]
        if g.chance(0.3):
            argv += ["--zscore", g.number_text("8", "3")]
        if g.chance(0.3):
            argv += ["--window", _int_opt(g, 5, 50)]
    elif cmd == "report":
        argv = ["observe", "report", *(["--since", g.arg_string(*SINCE_VALUES[:5])] if g.chance(0.3) else [])]
    else:
        argv = ["jobs"]
    if cmd not in ("logs",):
        argv += _maybe(g, 0.4, "--json")
    return Draft(argv, home=recipe)


def surface_home_db(g: Gen) -> Draft:
    job = template_job(g, hostile=False)
    recipe = HomeRecipe(jobs=[job])
    if g.chance(0.3):
        recipe.files["state.db"] = g.pick(
            (
                b"",
                b"not a database",
                b"SQLite format 3\x00" + b"\x00" * 100,
                Special("dir"),
                Special("symlink", "/dev/zero"),
                Special("fifo"),
            )
        )
        recipe.jobs[0].ingest = False
        g.note(f"state.db: {_preview(recipe.files['state.db'], 20)}")
    else:
        hostile_db_job(g, job)
    cmd = g.pick(("show 1", "jobs", "logs 1", "cost", "report", "diagnose 1", "trace 1", "preempt 1", "cancel 1"))
    argv = [*(["observe", "report"] if cmd == "report" else cmd.split())]
    argv += _maybe(g, 0.3, "--json") if cmd not in ("logs 1",) else []
    return Draft(argv, home=recipe, service_exit_ok=job.backend in ("slurm", "ray"))


def surface_home_env(g: Gen) -> Draft:
    """``$GPUFLEET_HOME`` itself hostile: a file, a FIFO, a device, a name too long (inside the working folder)."""
    kind = g.pick(("file", "fifo", "devnull", "long", "newline", "nested-file", "link-zero", "dir-of-junk"))
    if kind == "file":
        home = g.add_file("homefile", b"not a folder")
    elif kind == "fifo":
        home = g.add_file("homefifo", Special("fifo"))
    elif kind == "devnull":
        home = "/dev/null"
    elif kind == "long":
        home = "h" * 300
    elif kind == "newline":
        home = "home\n[bold]x"
    elif kind == "nested-file":
        g.add_file("plain", b"x")
        home = "plain/home"
    elif kind == "link-zero":
        home = g.add_file("homelink", Special("symlink", "/dev/zero"))
    else:
        g.add_file("junkhome/state.db", g.pick((b"garbage", b"")))
        g.add_file("junkhome/jobs/1/spec.json", b"{")
        home = "junkhome"
    g.env["GPUFLEET_HOME"] = home
    g.note(f"GPUFLEET_HOME={home[:40]!r} ({kind})")
    toy = g.add_file("toy.yaml", (EXAMPLES / "toy.yaml").read_bytes())
    argv = g.pick(
        (["jobs"], ["show", "1"], ["cost"], ["submit", toy], ["observe", "report"], ["logs", "1"], ["trace", "1"])
    )
    return Draft(list(argv))


GOODPUT_MIX: dict[str, Any] = {
    "name": "our-cluster-2025q3",
    "source": "incident tracker, July-September 2025",
    "reference_gpus": 4096,
    "reference_hours": 2208,
    "causes": [
        {"name": "GPU (Xid 79, 48, 94)", "count": 61, "reschedule": True},
        {"name": "host", "count": 14, "reschedule": True},
        {"name": "NCCL hang", "count": 9, "restart_seconds": 240},
        {"name": "kernel and firmware rollout", "count": 12, "planned": True},
    ],
}


def surface_goodput(g: Gen) -> Draft:
    argv = ["goodput", "--gpus", g.number_text("16384", "8", "1024", "10000000", p_valid=0.7)]
    argv += ["--work-hours", g.number_text("1296", "24", "0.5", p_valid=0.7)]
    argv += ["--save-seconds", g.number_text("20", "30", "2", p_valid=0.7)]
    argv += ["--restart-seconds", g.number_text("120", "300", "0", p_valid=0.7)]
    if g.chance(0.6):
        if g.chance(0.4):
            argv += ["--mix", g.arg_string("llama3", p_valid=0.8)]
        else:
            argv += ["--mix", g.input_path("mix", ".yaml", lambda: yaml_doc(g, GOODPUT_MIX))]
    else:
        argv += ["--gpu-mtbf-hours", g.number_text("50000", "1e6", "1")]
    optional = (
        ("--interval-seconds", ("auto", "600", "1e6", "60")),
        ("--restore-seconds", ("60", "0")),
        ("--reschedule-seconds", ("300", "0")),
        ("--planned-per-day", ("0.87", "0", "24")),
        ("--signal-save-seconds", ("20",)),
        ("--spares", ("0", "23", "1")),
        ("--gpus-per-node", ("8", "4", "1")),
        ("--spare-repair-hours", ("48", "1")),
        ("--spare-swap-seconds", ("0", "60")),
        ("--weibull-shape", ("1.0", "0.7", "2")),
        ("--async-stall-seconds", ("2",)),
        ("--fast-restore-seconds", ("6",)),
        ("--policy-spares", ("1", "10")),
    )
    for flag, valid in optional:
        if g.chance(0.2):
            argv += [flag, g.number_text(*valid, p_valid=0.6)]
    if g.chance(0.3):
        trials = g.number_text("10", "100", "300", p_valid=0.7)
        if trials.isascii() and trials.isdigit() and len(trials) < 10 and 300 < int(trials) <= 100_000:
            trials = g.pick(("100001", str(10**12), "0"))  # many valid trials only take long
        argv += ["--engine", g.arg_string("montecarlo", p_valid=0.85), "--trials", trials]
        if g.chance(0.3):
            argv += ["--seed", g.number_text("0", "1")]
    elif g.chance(0.1):
        argv += ["--engine", g.arg_string("analytic")]
    argv += _maybe(g, 0.2, "--save-on-signal") + _maybe(g, 0.3, "--no-policies")
    if g.chance(0.1):
        argv += ["--plot-interval", g.out_path("interval", ".png")]
    if g.chance(0.1):
        argv += ["--plot-fleet", g.out_path("fleet", ".png")]
    argv += _maybe(g, 0.3, "--json")
    return Draft(argv)


def surface_fleet_pools(g: Gen) -> Draft:
    """``gpufleet fleet use|show|down|up|off`` on a home whose fleet files may be hostile."""
    base = example("local-fleet.yaml")
    recipe = _home(g, hostile=False, p_empty=0.5) or HomeRecipe()
    if g.chance(0.6):
        recipe.files["fleet/fleet.yaml"] = dump_yaml(base).encode() if g.chance(0.7) else yaml_doc(g, base)
        recipe.files["fleet/marks.json"] = g.pick(
            (
                json.dumps({"epoch": T0, "down": {}}).encode(),
                json.dumps({"epoch": T0, "down": {"aws": True}}).encode(),
                b'{"epoch": NaN, "down": {}}',
                b'{"epoch": 1e400, "down": []}',
                b'{"epoch": "x", "down": {"[/]": "yes"}}',
                b"[" * 50_000,
                b"\xff",
                Special("dir"),
            )
        )
        if g.chance(0.3):
            recipe.files["fleet/failover.json"] = g.pick(
                (b"{}", b"[]", b'{"blocks": [{"target": "aws", "until": "never"}]}', b"[" * 50_000, b"nul\x00")
            )
        g.note("a fleet in use")
    which = g.pick(("use", "use", "show", "down", "up", "off", "submit", "slurm"))
    targets = ("aws", "aws/us-east-1", "aws/us-east-1/H100", "gcp", "coreweave/us-east-04/L40S")
    service = False
    if which == "slurm":  # the fleet as Slurm partitions and QOS; --apply needs the cluster
        argv = ["slurm", "fleet"]
        if g.chance(0.5):
            argv.append(g.input_path("local-fleet", ".yaml", lambda: yaml_doc(g, base)))
        if g.chance(0.4):
            argv += ["--nodes", g.arg_string("ALL", "gpu[1-4]", "node1,node2")]
        if g.chance(0.2):
            argv += ["--user", g.arg_string("root", "alice")]
        service = g.chance(0.2)
        argv += ["--apply"] if service else []
    elif which == "use":
        argv = ["fleet", "use", g.input_path("local-fleet", ".yaml", lambda: yaml_doc(g, base))]
    elif which in ("down", "up"):
        argv = ["fleet", which, g.arg_string(*targets, "a/b/c/d", "/", "*", p_valid=0.6)]
        argv += _maybe(g, 0.3, "--abrupt") if which == "down" else []
    elif which == "submit":
        spec = dict(g.pick(example("batch.yaml")["jobs"]))
        spec["resources"] = {"gpu_type": "H100", "gpus": 1}
        argv = ["submit", spec_path(g, base=spec)]
    else:
        argv = ["fleet", which]
    argv += _maybe(g, 0.3, "--json")
    return Draft(argv, home=recipe if (recipe.jobs or recipe.files) else None, service_exit_ok=service)


def surface_ckpt(g: Gen) -> Draft:
    for name, content in checkpoint_files(g, p_hostile=0.85).items():
        g.add_file(f"ck/{name}", content)
    directory = (
        "ck" if g.chance(0.9) else g.pick(("ck/step-00000010", "nothere", "ck/step-00000010/model.pt", "/dev/null"))
    )
    which = g.pick(("list", "verify", "verify", "export", "export"))
    argv = ["ckpt", which, directory]
    if which == "verify" and g.chance(0.4):
        argv += ["--job", g.arg_string("1", "7", "01")]
    if which == "export":
        argv += ["--out", g.out_path("model", ".pt") if g.chance(0.6) else "model.pt"]
        if g.chance(0.4):
            argv += ["--step", g.number_text("10", "20", "30")]
        if g.chance(0.3):
            argv += ["--entry", g.arg_string("model", "optimizer", "trainer", "bogus", "../model")]
    argv += _maybe(g, 0.4, "--json")
    return Draft(argv)


ID_TEXTS: tuple[str, ...] = (
    "1",
    "2",
    "99",
    "0",
    "-1",
    "99999999999999999999999999999",
    str(2**63 - 1),
    str(2**63),
    "1.0",
    "1e3",
    "abc",
    "",
    "\u0661",
    "0x1",
    " 1",
    "9" * 5000,
)


def surface_job_ids(g: Gen) -> Draft:
    home = _home(g, hostile=False, p_empty=0.4)
    job = str(g.pick(ID_TEXTS)) if g.chance(0.8) else "1"
    cmd = g.pick(
        (
            "show",
            "logs",
            "preempt",
            "cancel",
            "resize",
            "diagnose",
            "trace",
            "spikes",
            "jobs",
            "hold",
            "hold",
            "release",
        )
    )
    service = False
    if cmd == "logs":
        argv = ["logs", job, *(["--attempt", g.number_text("1", "2")] if g.chance(0.5) else [])]
    elif cmd == "preempt":
        argv = ["preempt", job, *(["--grace", g.number_text("10", "0.5")] if g.chance(0.6) else [])]
    elif cmd == "resize":
        argv = ["resize", job, "--gpus", _int_opt(g, 1, 2)]
        if g.chance(0.3):
            argv += ["--nodes", _int_opt(g, 1, 2)]
        argv += _maybe(g, 0.3, "--now")
    elif cmd == "diagnose":
        argv = ["diagnose", job, "--window", g.number_text("60", "1"), "--min-duration", g.number_text("300", "1")]
    elif cmd == "spikes":
        argv = ["debug", "spikes", job]
        if g.chance(0.3):
            argv += ["--zscore", g.number_text("8")]
        if g.chance(0.3):
            argv += ["--window", g.number_text("5", "50")]
    elif cmd == "jobs":
        argv = ["jobs", "--team", g.arg_string("perception"), "--state", g.arg_string("running", "completed", "queued")]
    elif cmd == "hold" and g.chance(0.5):
        argv = ["slurm", g.pick(("hold", "release", "preempt")), g.arg_string(job, "slurm:12", "slurm:", "slurm:x")]
        service = True
    else:
        argv = [cmd, job]
    if cmd in ("show", "cancel", "trace", "preempt", "resize", "diagnose", "jobs", "hold", "release"):
        argv += _maybe(g, 0.3, "--json")
    if home is not None:
        service = service or any(j.backend in ("slurm", "ray") for j in home.jobs)
    return Draft(argv, home=home, service_exit_ok=service)


def surface_spikes_csv(g: Gen) -> Draft:
    rows = ["step,loss"] if g.chance(0.9) else [g.pick(("loss,step", "step", "step;loss", "", "step,loss,extra"))]
    for step in range(1, g.pick((0, 3, 30, 200)) + 1):
        loss = repr(2.0 + g.rng.gauss(0, 0.05))
        if g.chance(0.1):
            loss = str(g.pick(CELLS))
        cell = str(step) if not g.chance(0.05) else str(g.pick(("-1", "1e3", "", "x", "9" * 5000, "1.5", str(2**64))))
        rows.append(f"{cell},{loss}")
    text = "\n".join(rows) + "\n"
    data = text.encode() if not g.chance(0.15) else mutate_text(g, text)
    if g.chance(0.03):
        data = b"step,loss\n1," + b"9" * 200_000 + b"\n"
        g.note("a cell over the csv field limit")
    path = g.input_path("losses", ".csv", lambda: data, p_special=0.08)
    argv = ["debug", "spikes", path]
    if g.chance(0.3):
        argv += ["--zscore", g.number_text("8", "3")]
    if g.chance(0.3):
        argv += ["--window", g.number_text("5", "50")]
    argv += _maybe(g, 0.3, "--json")
    return Draft(argv)


MODEL_NAMES: tuple[str, ...] = ("tabular-demo", "m", "a" * 129, "", "../x", "a b", "[bold]", "é", "-x", "m.1_2-3")


def surface_registry(g: Gen) -> Draft:
    model = g.arg_string(*MODEL_NAMES, p_valid=0.6)
    which = g.pick(("history", "promote", "rollback", "doc"))
    if which == "history":
        argv = ["registry", "history", model]
    elif which == "promote":
        argv = ["registry", "promote", model, g.arg_string("1", "2", "0", "-1", "v1", str(2**64)), "--reason"]
        argv.append(g.arg_string("because", "  ", ""))
    elif which == "rollback":
        argv = ["registry", "rollback", model, "--reason", g.arg_string("because", " ")]
    else:
        argv = ["quality", "doc", model]
        if g.chance(0.3):
            argv += ["--out", g.out_path("doc", ".md")]
        if g.chance(0.2):
            argv += ["--purpose", g.arg_string("credit scoring")]
    argv += _maybe(g, 0.3, "--json")
    if g.chance(0.1):
        g.env["MLFLOW_TRACKING_URI"] = g.pick(
            ("http://127.0.0.1:1", "bogus://x", "sqlite:///no/such/dir/m.db", "file:")
        )
        g.note(f"MLFLOW_TRACKING_URI={g.env['MLFLOW_TRACKING_URI']}")
    return Draft(argv, service_exit_ok=True)


def surface_service_ops(g: Gen) -> Draft:
    which = g.pick(("slurm", "slurm", "submit", "trace"))
    if which == "slurm":
        op = g.pick(("drain", "resume", "usage", "account add", "account list", "hold", "release", "preempt"))
        argv = ["slurm", *op.split()]
        if op in ("drain", "resume"):
            argv.append(g.arg_string("node1", "gpu[01-04]", "gpu[0-99999999]"))
            if op == "drain" and g.chance(0.5):
                argv += ["--reason", g.arg_string("DIMM")]
        elif op == "account add":
            argv.append(g.arg_string("robotics", "perception"))
            if g.chance(0.5):
                argv += ["--fairshare", g.number_text("10", "1")]
            if g.chance(0.3):
                argv += ["--user", g.arg_string("root")]
        elif op in ("hold", "release", "preempt"):
            argv.append(g.arg_string("slurm:12", "1"))
        argv += _maybe(g, 0.3, "--json")
        return Draft(argv, service_exit_ok=True)
    if which == "submit":
        spec = g.add_file("spec.yaml", (EXAMPLES / "toy.yaml").read_bytes())
        argv = ["submit", spec, "--backend", g.pick(("slurm", "ray")), *_maybe(g, 0.3, "--json")]
        if g.chance(0.3):
            g.env["GPUFLEET_RAY_ADDRESS"] = g.pick(("127.0.0.1:1", "host", "http://x:1", "[::1]:99999", "a:b"))
            g.note(f"GPUFLEET_RAY_ADDRESS={g.env['GPUFLEET_RAY_ADDRESS']}")
        return Draft(argv, service_exit_ok=True)
    endpoint = g.arg_string(
        "http://127.0.0.1:1", "http://127.0.0.1:1/v1/traces", "ftp://x", "http://", "http://a b", "localhost:4318"
    )
    return Draft(
        ["trace", "1", "--endpoint", endpoint], home=_home(g, hostile=False, p_empty=0.0), service_exit_ok=True
    )


def surface_webhook(g: Gen) -> Draft:
    alert: dict[str, Any] = {
        "schema_version": 1,
        "model": "tabular-demo",
        "action": "retrain",
        "window": "window-7",
        "dataset": "current",
        "reasons": ["dataset drift in 2 consecutive windows"],
        "evidence": {"share_drifted": 0.6, "drifted_columns": ["x0"]},
    }
    roll = g.rng.random()
    if roll < 0.15:
        body = g.pick(
            (
                b"[" * 30_000 + b"]" * 30_000,
                b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
                b"\xff\xfe\x00",
                b"",
                b"null",
                b'{"model": ' + b"9" * 5000 + b"}",
                b"x" * (70 * 1024),
                json.dumps({**alert, "evidence": {"x": float("nan")}}).encode(),
                b'{"schema_version": 1, "model": "\\ud800", "action": "alert", "window": "w"}',
            )
        )
        g.note(f"body {body[:30]!r}")
    else:
        data: Any = copy.deepcopy(alert)
        for _ in range(g.rng.randint(0 if g.chance(0.2) else 1, 3)):
            data = mutate_tree(g, data, [])
        body = json.dumps(data, allow_nan=True).encode("utf-8", "surrogatepass")
    ts = str(WEBHOOK_NOW - g.pick((0, 0, 10, 299, 301, -400)))
    headers = {
        "Content-Type": "application/json",
        "X-Gpufleet-Timestamp": ts,
        "X-Gpufleet-Signature": "sha256="
        + hmac.new(WEBHOOK_SECRET, ts.encode() + b"." + body, hashlib.sha256).hexdigest(),
        "Idempotency-Key": "alert-" + "".join(g.pick(string.ascii_lowercase) for _ in range(10)),
    }
    if g.chance(0.25):
        key = g.pick(sorted(headers))
        headers[key] = g.pick(
            (
                "",
                " ",
                "\u0661\u0662\u0663",
                "9" * 40,
                "sha256=" + "G" * 64,
                "a" * 200,
                "\xff\xfe",
                "key with space",
                headers[key].upper(),
                str(2**64),
                "-1",
            )
        )
        g.note(f"header {key} = {headers[key][:30]!r}")
    if g.chance(0.1):
        headers.pop(g.pick(sorted(headers)))
    g.add_file("request.json", json.dumps({"headers": headers}).encode())
    g.add_file("body.bin", body)
    if g.chance(0.15):
        journal = g.pick(
            (
                b'{"key": "alert-aaaaaaaaaa", "signature": "s", "expires": 1e400}\n',
                b"[" * 50_000 + b"\n",
                b'{"key": "k", "expires": ' + b"9" * 5000 + b"}\n",
                b"\xff\xfe\n",
                b'{"key": ["k"], "signature": {}, "expires": "soon"}\n',
            )
        )
        g.add_file("journal.jsonl", journal)
        g.note(f"journal {_preview(journal, 20)}")
    return Draft(["webhook"], target="webhook")


def surface_exporter(g: Gen) -> Draft:
    argv = ["observe", "exporter", "--port", "0", "--port-file", "port.txt"]
    if g.chance(0.6):
        argv += ["--pattern", g.arg_string("healthy", "comm_bound", "idle", p_valid=0.7)]
    if g.chance(0.4):
        argv += ["--gpus", _int_opt(g, 1, 8)]
    if g.chance(0.3):
        argv += ["--nodes", _int_opt(g, 1, 2)]
    if g.chance(0.4):
        argv += ["--job", g.arg_string("42", "")]
    if g.chance(0.3):
        argv += ["--seed", g.number_text("0", "5")]
    if g.chance(0.4):
        argv += ["--step-seconds", g.number_text("1", "5", "0.5")]
    return Draft(argv, serves="port.txt")


def surface_out_paths(g: Gen) -> Draft:
    which = g.pick(("rules", "dashboard", "cost", "report", "skypilot", "seasonal", "ckpt"))
    out = g.out_path("out", g.pick((".yaml", ".json", "", ".png")))
    home = None
    if which in ("rules", "dashboard"):
        argv = ["observe", which, "--out", out]
    elif which == "cost":
        argv = ["cost", "--out", out]
        home = _home(g, hostile=False, p_empty=0.3)
    elif which == "report":
        argv = ["observe", "report", "--out", out]
        home = _home(g, hostile=False, p_empty=0.3)
    elif which == "skypilot":
        spec = g.add_file("toy.yaml", (EXAMPLES / "toy.yaml").read_bytes())
        argv = ["export", "skypilot", spec, "--out", out, *_maybe(g, 0.3, "--json")]
    elif which == "seasonal":
        argv = ["quality", "lab-seasonal", "--out", out, *_maybe(g, 0.3, "--json")]
        if g.chance(0.3):
            argv += ["--seed", g.number_text("0", "1")]
    else:
        for name, content in g.templates.under("ckpt/").items():
            g.add_file(f"ck/{name}", content)
        argv = ["ckpt", "export", "ck", "--out", out]
    return Draft(argv, home=home)


def surface_long_parse(g: Gen) -> Draft:
    """Commands that run for minutes, given arguments their parser refuses (nothing may start)."""
    argv = g.pick(
        (
            ["demo", "--bogus"],
            ["demo", "extra-argument"],
            ["demo", "--json=3"],
            ["demo", "--fault"],
            ["quality", "demo", "--mode", g.arg_string("", "canary ", "[bold]", "x", p_valid=1.0)],
            ["quality", "demo", "--preempt=maybe"],
            ["quality", "lab-embeddings", "--seed", g.pick(("abc", "1.5", "", "nan", "\u0661"))],
            ["quality", "lab-seasonal", "--seed", g.pick(("abc", "1.5", ""))],
            ["quality", "lab-policy", "--label-delay", g.pick(("0", "21", "abc", "-1", ""))],
            ["debug", "resume-check"],
            ["observe", "exporter", "--port", g.pick(("-1", "65536", "abc", "99999999999999999999"))],
            ["observe", "exporter", "--port", "0", "--pattern", g.pick(("nope", "", "[/]"))],
            ["observe", "exporter", "--port", "0", "--step-seconds", g.pick(("0", "-1", "nan", "-inf", "abc"))],
            ["observe", "exporter", "--port", "0", "--gpus", g.pick(("0", "-1", "x"))],
            [g.pick(("nonexistent", "SUBMIT", "", "--version", "-h"))],
            ["estimate", "mfu"],
            ["ckpt", "list"],
        )
    )
    return Draft([sanitize_argv(a) for a in argv])


def surface_sweep(g: Gen) -> Draft:
    """``gpufleet sweep run|show|best``: hostile sweep files; a valid one runs one short trial."""
    base = example("sweep.yaml")
    base["budget"], base["parallelism"] = {"trials": 1}, 1
    base["base"]["args"].update(steps=2, eval_every=1)
    which = g.pick(("run", "run", "run", "show", "best", "note"))
    name = g.arg_string("lm-sweep", "other", "../x", "LM")
    if which == "run":
        # --once: no scheduler runs here, so a sweep waiting for its trials would never end.
        argv = ["sweep", "run", g.input_path("sweep", ".yaml", lambda: yaml_doc(g, base)), "--once"]
        if g.chance(0.2):
            argv += ["--backend", g.arg_string("local", "bogus", "LOCAL")]
        if g.chance(0.2):
            argv += ["--poll", g.number_text("0.1", "1")]
    elif which == "show":
        argv = ["sweep", "show", name, *_maybe(g, 0.3, "--plot", g.out_path("sweep", ".png"))]
    elif which == "best":
        argv = ["sweep", "best", name, "--out", g.out_path("best", ".yaml")]
    else:
        argv = ["sweep", "note", name, *_maybe(g, 0.5, "--ranks", g.arg_string("1,2,4", "2", "0", "1,,2", "99"))]
        argv += _maybe(g, 0.3, "--out", g.out_path("note", ".md"))
        argv += _maybe(g, 0.2, "--steps", g.number_text("20"))
    if which != "run" and g.chance(0.2):
        argv += ["--storage", g.arg_string("sqlite:///x.db", "bogus://", "sqlite:////no/such/dir/s.db")]
    argv += _maybe(g, 0.3, "--json")
    return Draft(argv, home=_home(g, hostile=False, p_empty=0.5))


def surface_monitor(g: Gen) -> Draft:
    """``gpufleet quality monitor run --once``: hostile monitor files over the drift surface's tables.

    A valid file runs one round over a folder of up to three windows (or one table); a retrain decision
    queues its spec in the case's home, as ``submit`` does (no scheduler runs it).
    """
    if g.chance(0.1):
        return Draft(["quality", "monitor", "history", *_maybe(g, 0.5, "--json")], home=_home(g, p_empty=0.5))
    if g.chance(0.08):  # into a new folder, one that exists, or a path that cannot be one
        folder = g.pick(("sample", "sample/deeper", g.add_file("taken.csv", b"a\n1\n"), "/dev/null", ""))
        return Draft(["quality", "monitor", "sample-data", folder, *_maybe(g, 0.5, "--json")])
    if g.chance(0.25):  # the outbox of a home that has none, or bad arguments
        which = g.pick(("log", "replay", "send"))
        argv = ["quality", "webhook", which]
        if which == "log":
            argv += _maybe(g, 0.5, "--limit", g.number_text("5", "0", "-1"))
        elif which == "replay":
            argv += [g.pick(("--failed", g.arg_string("model:window-0001", "", "../x", p_valid=0.5)))]
        else:
            argv += _maybe(g, 0.4, "--max-attempts", g.number_text("1", "0", "-3"))
        return Draft([*argv, *_maybe(g, 0.5, "--json")], home=_home(g, p_empty=0.5))
    ref, cols = table_file(g, "ref", shift=0.0, columns=None)
    if g.chance(0.12):  # performance without labels over the same tables: most columns are refused
        cur, _ = table_file(g, "cur", shift=g.pick((0.0, 0.5)), columns=cols)
        names = cols or ["x0"]
        argv = ["quality", "estimate", ref, cur, "--target", g.pick(names)]
        argv += ["--metric", g.pick(("roc_auc", "f1", "accuracy", "mae", "rmse", "auc", ""))]
        argv += _maybe(g, 0.6, "--score", g.pick(names))
        argv += _maybe(g, 0.3, "--prediction", g.pick(names))
        argv += _maybe(g, 0.3, "--chunk-size", g.number_text("50", "0", "-1"))
        argv += _maybe(g, 0.2, "--out", g.out_path("estimate", g.pick((".png", ".svg", ".txt"))))
        return Draft([*argv, *_maybe(g, 0.5, "--json")])
    if g.chance(0.75):
        current = g.add_file(g.name("windows", ""), Special("dir"))
        for _ in range(g.rng.randint(0, 3)):
            window, _ = table_file(g, "cur", shift=g.pick((0.0, 0.5, 3.0)), columns=cols if g.chance(0.8) else None)
            if window in g.files:  # a file of the case: moved into the folder (a hostile path stays as it is)
                g.add_file(f"{current}/{window}", g.files.pop(window))
    else:
        current, _ = table_file(g, "cur", shift=g.pick((0.0, 3.0)), columns=cols)
    base = example("monitor.yaml")
    model = base["models"][0]
    model.update(reference=ref, current=current)
    model.pop("columns")
    if cols and g.chance(0.4):
        model["columns"] = g.rng.sample(cols, g.rng.randint(1, len(cols)))
    if cols and g.chance(0.3):
        model["metric"] = {"name": g.pick(("auc", "accuracy")), "baseline": 0.9, "label": cols[0], "score": cols[-1]}
    model["policy"]["persistence"] = g.pick((1, 2))
    if g.chance(0.8):
        toy = (EXAMPLES / "toy.yaml").read_bytes()
        model["retrain"] = spec_path(g) if g.chance(0.3) else g.add_file("toy.yaml", toy)
    else:
        model.pop("retrain")
    if g.chance(0.2):
        base["models"].append({**copy.deepcopy(model), "name": g.arg_string(*MODEL_NAMES, p_valid=0.6)})
    argv = ["quality", "monitor", "run", g.input_path("monitor", ".yaml", lambda: yaml_doc(g, base)), "--once"]
    argv += _maybe(g, 0.4, "--json")
    return Draft(argv, home=_home(g, hostile=False, p_empty=0.5))


BENCH_SIZES: tuple[str, ...] = ("1MiB", "2M", "1048576", "4MiB", "1.5M")
"""Sizes of a ``bench disk`` test file that run: a few MiB, far below the cases' file-size limit."""
BENCH_BAD_SIZES: tuple[str, ...] = (
    "0", "-1", "10 potatoes", "1e3", "", " ", "MiB", "1iB", "nan", "9" * 30, "9" * 5000, "2PiB", "1000TiB",
    "0.0001K", "\u0661M", "[bold]1M", "1M\n",
)  # fmt: skip
BENCH_BAD_NUMBERS: tuple[str, ...] = ("0", "-1", "nan", "inf", "-inf", "1e400", "abc", "", "0x10", "\u0661", "1,5")
BENCH_BAD_HOSTS: tuple[str, ...] = ("-s", "", " ", "a b", "[bold]x", "\x00", "a;b|c&d", "$(id)", "é", "x" * 300)
"""Hosts ``bench net`` refuses before resolving them: none of them may ever pass the check."""


def surface_bench_disk(g: Gen) -> Draft:
    """``gpufleet bench disk``: hostile folders, sizes and runtimes; a valid case runs fio on a few MiB, 0.1 s a test.

    The folder is one of the working directory's (or a hostile path that no folder is written in);
    without PATH, ``$GPUFLEET_HOME`` is a relative name, so the default lands in the working directory.
    """
    argv = ["bench", "disk"]
    roll = g.rng.random()
    if roll < 0.6:
        argv.append(g.add_file(g.name("disk", ""), Special("dir")))
    elif roll < 0.85:
        argv.append(sanitize_argv(g.special_input("disk", "", lambda: b"not a folder\n")))
    else:
        g.env["GPUFLEET_HOME"] = g.pick(("fleet-home", "a/b/home", "plain/home"))
        if g.env["GPUFLEET_HOME"].startswith("plain/"):
            g.add_file("plain", b"a file where the home's folder would be\n")
        g.note(f"GPUFLEET_HOME={g.env['GPUFLEET_HOME']}")
    if g.chance(0.85):
        argv += ["--size", g.pick(BENCH_SIZES) if g.chance(0.75 if g.calm else 0.5) else g.pick(BENCH_BAD_SIZES)]
    else:
        argv += ["--size", "1MiB"]  # never the default 256 MiB: the cases' file-size limit is 256 MiB
    runtime = g.pick(("0.1", "0.1", "0.2")) if g.chance(0.75 if g.calm else 0.5) else g.pick(BENCH_BAD_NUMBERS)
    argv += ["--runtime", g.pick(("3601", "0.05")) if runtime == "inf" and g.chance(0.5) else runtime]
    argv += _maybe(g, 0.4, "--json")
    return Draft(argv)


STAGE_DATA_BLOCKS: tuple[Any, ...] = (
    {"sources": [{"source": "corpus", "dest": "c"}]},
    {"sources": [{"source": "corpus/a.txt", "dest": "one"}], "workers": 1, "verify": "full"},
    {"sources": [{"source": "corpus", "dest": "c", "cache": "shared"}]},
    {"sources": [{"source": "missing-folder", "dest": "c"}]},
    {"sources": [{"source": "corpus", "dest": "../escape"}]},
    {"sources": [{"source": "corpus", "dest": "/abs"}]},
    {"sources": []},
    {"sources": [{"source": "nope://x/y", "dest": "c"}]},
    {"sources": [{"source": "memory://x", "dest": "c"}]},
    {"sources": [{"source": "gs://bucket/x", "dest": "c"}]},
    {"sources": [{"source": "corpus", "dest": "c"}, {"source": "corpus", "dest": "c/d"}]},
    {"sources": [{"source": "corpus", "dest": "c", "endpoint_url": "http://127.0.0.1:9"}]},
    {"sources": [{"source": "corpus", "dest": "c"}], "workers": 0},
    {"sources": [{"source": "corpus\u0000x", "dest": "c"}]},
    None,
)
"""``data`` blocks for ``bench stage``: a fixed list (a mutated source could name ``/`` and stage the disk)."""


def surface_bench_stage(g: Gen) -> Draft:
    """``gpufleet bench stage``: a small local corpus staged into the working directory, or a refused spec."""
    g.add_file("corpus/a.txt", b"a small corpus\n" * g.pick((1, 100, 5000)))
    g.add_file("corpus/sub/b.bin", bytes(range(256)) * g.pick((1, 64)))
    spec: dict[str, Any] = {"name": "stage", "entrypoint": "m:f"}
    data = g.pick(STAGE_DATA_BLOCKS)
    if data is not None:
        spec["data"] = copy.deepcopy(data)
    argv = ["bench", "stage", g.input_path("stage", ".yaml", lambda: dump_yaml(spec).encode())]
    roll = g.rng.random()
    if roll < 0.8:
        argv += ["--dir", g.add_file(g.name("scratch", ""), Special("dir"))]
    else:
        argv += ["--dir", sanitize_argv(g.special_input("scratch", "", lambda: b"not a folder\n"))]
    argv += ["--disk-size", g.pick(BENCH_SIZES) if g.chance(0.8) else g.pick(BENCH_BAD_SIZES)]
    argv += ["--disk-runtime", g.pick(("0.1", "0.2")) if g.chance(0.8) else g.pick(BENCH_BAD_NUMBERS)]
    argv += _maybe(g, 0.4, "--json")
    return Draft(argv)


def surface_bench_net(g: Gen) -> Draft:
    """``gpufleet bench net``: a 1 s loopback run, or options refused before anything connects anywhere.

    A host that passes the check would be resolved and connected to: every host a case names is one
    of :data:`BENCH_BAD_HOSTS`, so no case reaches the network.
    """
    argv = ["bench", "net", "--seconds", "1", *_maybe(g, 0.3, "--streams", g.pick(("1", "2")))]
    bad = [
        ["--seconds", g.pick(("0", "-1", "1.5", "3601", *BENCH_BAD_NUMBERS))],
        ["--streams", g.pick(("0", "-1", "129", "99999999999999999999", "x", ""))],
        ["--port", g.pick(("0", "-1", "65536", "99999999999999999999", "abc", ""))],
        ["--host", sanitize_argv(g.pick(BENCH_BAD_HOSTS))],
    ]
    if g.chance(0.4 if g.calm else 0.7):  # after the valid options: the last of a repeated option wins
        for option in g.rng.sample(bad, g.rng.randint(1, 2)):
            argv += option
    argv += _maybe(g, 0.3, "--reverse") + _maybe(g, 0.4, "--json")
    return Draft(argv)


SERVE_HOSTS = (
    "127.0.0.1",
    "localhost",
    "",
    " ",
    "256.1.1.1",
    "no-such-host.invalid",
    "127.0.0.1:80",
    "[::1]",
    "a" * 300,
)
"""``gpufleet serve --host`` values: loopback, or refused before anything listens (never every interface)."""


def surface_serve(g: Gen) -> Draft:
    """``gpufleet serve``: a server on a free loopback port that must answer ``GET /api/jobs`` with 200, or
    options refused before it listens (a token file others may read, a bad monitor or secret, a bad host)."""
    argv = ["serve", "--port", "0", "--port-file", "port.txt"]
    token = g.pick(("none", "default", "default", "file"))
    if token == "none":
        argv.append("--no-token")
    elif token == "file":  # written 0644 by the harness: refused, the server does not start
        argv += ["--token-file", g.add_file("serve.token", g.pick((b"x" * 40 + b"\n", b"", b"short\n", b"\xff" * 64)))]
    if g.chance(0.3):
        argv += ["--host", g.pick(SERVE_HOSTS)]
    if g.chance(0.3):
        argv += ["--refresh", g.number_text("2", "0.5")]
    if g.chance(0.3):
        argv += ["--cache", g.number_text("1", "0")]
    if g.chance(0.25):
        secret = g.pick((b"s" * 40, b"short", b"", b"\x00" * 64))
        argv += ["--webhook-secret-file", g.add_file("webhook.secret", secret)]
    if g.chance(0.2):
        monitor = g.pick((b"models: []\n", b"every: -1\nmodels: [{name: a}]\n", b"[", b"\xff\xfe", b"models: 7\n"))
        argv += ["--monitor", g.add_file("monitor.yaml", monitor)]
        g.note(f"monitor {_preview(monitor, 20)}")
    return Draft(argv, home=_home(g, hostile=False, p_empty=0.5), serves="port.txt", serves_path="/api/jobs")


# ---- the HTTP surface of `gpufleet serve` -------------------------------------------------------

ALLOWED_NAMES = ("fleet.internal", "gpu-box.lan", "dash.example.org")
"""``--allowed-host`` values a case may give."""
FOREIGN_HOSTS: tuple[bytes, ...] = (
    b"evil.example",
    b"evil.example:@PORT@",
    b"127.0.0.1.evil.com",
    b"localhost.evil.com:@PORT@",
    b"127.0.0.1.nip.io",
    b"",
    b"x" * 4000,
    b"[::2]",
    b"[::1].evil.com",
    b"0.0.0.0",
    b"10.0.0.1:@PORT@",
    b"xn--80ak6aa92e.com",
    b"\xd0\xb5xample.com",
    b"evil.example:@PORT@@127.0.0.1",
    b"fleet.internal.evil.com",
)
"""Host header values no server may accept (not loopback, not ``--host``, not an ``--allowed-host``)."""
UNSURE_HOSTS: tuple[bytes, ...] = (
    b"LOCALHOST",
    b"localhost.",
    b"127.0.0.2",
    b"127.0.0.1:1",
    b"127.1",
    b"[0:0:0:0:0:0:0:1]",
    b"localhost:99999",
)
"""Host header values a server may take either way: only the general rules apply to their answers."""
PLAIN_ROUTES: tuple[str, ...] = (
    "/",
    "/api/jobs",
    "/api/fleet",
    "/api/cost",
    "/api/quality",
    "/cost",
    "/quality",
    "/static/app.js",
    "/api/jobs?team=perception",
    "/api/cost?period=7d",
    "/api/openapi.json",
)
HOSTILE_QUERIES: tuple[str, ...] = (
    "/api/jobs?team=%00",
    "/api/jobs?team=a%00b",
    "/api/jobs?team=%FF%FE",
    "/api/jobs?team=%C3%A9",
    "/api/jobs?team=%E2%80%AEevil",
    "/api/jobs?team=%5Bbold%5D",
    "/api/jobs?team=a&team=b&team=c",
    "/api/jobs?state=bogus",
    "/api/jobs?state=%0Arunning",
    "/api/jobs?team=",
    "/api/jobs?=x",
    "/api/jobs?team",
    "/api/jobs?%ZZ=1",
    "/api/cost?period=24h&period=all",
    "/api/cost?team=%00",
    "/api/jobs/1/logs?attempt=1&attempt=2",
    "/jobs/1?x=%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/static/..%2fapp.js",
    "/static/%2e%2e%2f%2e%2e%2fpyproject.toml",
    "/api/jobs/%2e%2e/%2e%2e",
    "/api/jobs?" + "&".join(f"k{i}=v" for i in range(400)),
)
"""Queries with odd but short values: anything but a 5xx."""
BAD_NUMBERS: tuple[str, ...] = ("inf", "-inf", "nan", "NaN", "-1", "0", "1e309", "-1e309", "abc", "", "%00", "1e3x")
BAD_IDS: tuple[str, ...] = ("0", "-1", str(2**63), str(2**64), "1e3", "abc", "%00", "1.5", "0x10", "%20")
JOB_VERBS: tuple[str, ...] = ("preempt", "cancel", "hold", "release")
BIG_BODY = 64 << 10
"""The API's body limit: a larger body is answered 413."""


def _request(
    method: str,
    target: str,
    *,
    host: bytes | None = b"127.0.0.1:@PORT@",
    headers: Sequence[tuple[str, bytes]] = (),
    body: bytes | None = None,
    version: str = "HTTP/1.1",
    chunked: bool = False,
    length: int | None = None,
) -> bytes:
    """Raw request bytes; ``length`` overrides the Content-Length of ``body``."""
    lines = [f"{method} {target} {version}".encode()]
    if host is not None:
        lines.append(b"Host: " + host)
    lines += [name.encode() + b": " + value for name, value in headers]
    lines.append(b"Connection: close")
    payload = b""
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
        data = body or b""
        for at in range(0, len(data), 8192):
            part = data[at : at + 8192]
            payload += f"{len(part):x}\r\n".encode() + part + b"\r\n"
        payload += b"0\r\n\r\n"
    elif body is not None or length is not None:
        lines.append(f"Content-Length: {len(body or b'') if length is None else length}".encode())
        payload = body or b""
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload


def _json_body(g: Gen) -> tuple[str, bytes]:
    """A body for the action routes: valid, malformed, or of the wrong shape."""
    label, body = g.pick(
        (
            ("valid", b'{"version": "1", "reason": "fuzz"}'),
            ("malformed", b'{"version": '),
            ("not-json", b"\xff\xfe\x00garbage"),
            ("array", b"[1, 2, 3]"),
            ("deep", b"[" * 5000 + b"]" * 5000),
            ("nan", b'{"version": NaN, "reason": Infinity}'),
            ("empty", b""),
            ("huge-number", b'{"version": ' + b"9" * 5000 + b', "reason": "x"}'),
        )
    )
    return str(label), bytes(body)


def _action_target(g: Gen) -> str:
    """An action route; a job's is for one no home holds, so that a request let through changes nothing."""
    if g.chance(0.5):
        return f"/api/jobs/{g.pick(('999999', '424242'))}/{g.pick(JOB_VERBS)}"
    return f"/api/registry/{g.pick(('tabular-demo', 'm'))}/{g.pick(('promote', 'rollback'))}"


class _Hosts:
    """What Host values a case's server must accept."""

    def __init__(self, g: Gen, host: str, allowed: list[str]) -> None:
        self.g = g
        self.names = ["127.0.0.1", "localhost", "[::1]", *allowed]
        if host not in ("127.0.0.1", "localhost"):
            self.names.append(host)

    def good(self) -> bytes:
        name = str(self.g.pick(self.names))
        return (name + str(self.g.pick(("", ":@PORT@")))).encode()


def _step_plain(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    version = g.pick(("HTTP/1.1", "HTTP/1.1", "HTTP/1.0"))
    route = g.pick(PLAIN_ROUTES)
    return HttpStep("plain GET", _request("GET", route, host=hosts.good(), version=version), statuses=(200,))


def _step_foreign_host(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    host = g.pick(FOREIGN_HOSTS)
    extra: list[tuple[str, bytes]] = []
    if token and g.chance(0.3):
        extra.append(("Authorization", b"Bearer " + TOKEN_MARK))
    if g.chance(0.5):
        raw = _request("GET", g.pick((*PLAIN_ROUTES, "/api/jobs/1", "/jobs/1")), host=host, headers=extra)
    else:
        _, body = _json_body(g)
        raw = _request("POST", _action_target(g), host=host, headers=extra, body=body)
    return HttpStep("foreign Host", raw, statuses=(400, 403, 421))


def _step_odd_host(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    # (Two Host headers, or none in HTTP/1.1, are refused by the HTTP parser itself, before the app.)
    kind = g.pick(("unsure", "absent-1.0", "absolute-form"))
    if kind == "unsure":
        raw = _request("GET", g.pick(PLAIN_ROUTES), host=g.pick(UNSURE_HOSTS))
    elif kind == "absent-1.0":
        raw = _request("GET", g.pick(PLAIN_ROUTES), host=None, version="HTTP/1.0")
    else:
        raw = _request("GET", "http://evil.example/api/jobs", host=hosts.good())
    return HttpStep(f"Host {kind}", raw)


def _step_long_query(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    value = g.pick(("a" * 200, "%41" * 300, "t" * 5000, "%C3%A9" * 150))
    route = g.pick(("/api/jobs?team=", "/api/cost?team=", "/api/jobs?state=", "/api/cost?period="))
    return HttpStep("long query", _request("GET", route + value, host=hosts.good()), statuses=(400, 414, 422))


def _step_hostile_query(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    return HttpStep("odd query", _request("GET", g.pick(HOSTILE_QUERIES), host=hosts.good()))


def _step_bad_number(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    roll = g.rng.random()
    if roll < 0.45:
        param = g.pick(("window", "min_duration"))
        target = f"/api/jobs/{g.pick(('1', '2'))}/diagnosis?{param}={g.pick(BAD_NUMBERS)}"
    elif roll < 0.7:
        target = f"/api/jobs/1/logs?attempt={g.pick(('0', '-1', str(2**63), str(2**64), 'nan', '1.5', 'inf'))}"
    else:
        target = g.pick(("/api/jobs/{}", "/jobs/{}", "/api/jobs/{}/series", "/api/jobs/{}/trace")).format(
            g.pick(BAD_IDS)
        )
    return HttpStep("bad number", _request("GET", target, host=hosts.good()), statuses=(400, 404, 422))


def _step_unauthenticated(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    """A POST to an action without the token: 401 (403 across origins or without a token) before the body."""
    headers: list[tuple[str, bytes]] = []
    if g.chance(0.3):
        headers.append(("Authorization", g.pick((b"Bearer wrong-token-0123456789abcdef", b"Basic YTpi", b"Bearer "))))
    if g.chance(0.3):
        headers.append(("Origin", g.pick((b"http://evil.example", b"null", b"http://127.0.0.1.evil.com"))))
    if g.chance(0.3):
        headers.append(("Content-Type", g.pick((b"application/json", b"text/plain", b"multipart/form-data; x"))))
    shape = g.pick(("small", "big", "declared", "chunked", "chunked-big"))
    label, body = _json_body(g)
    target = _action_target(g)
    if shape == "big":
        body = b"{" + b" " * (200 << 10)
    elif shape == "chunked-big":
        body = b" " * (100 << 10)
    if shape == "declared":
        raw = _request("POST", target, host=hosts.good(), headers=headers, length=g.pick((10**10, 2**62, 1 << 30)))
    else:
        raw = _request("POST", target, host=hosts.good(), headers=headers, body=body, chunked=shape.startswith("chunk"))
    return HttpStep(f"no token, {shape} {label} body", raw, statuses=(401, 403))


def _step_authenticated(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    """A POST with the token: too large (413), malformed (400/422), a bad model name (never 409), another origin."""
    auth = ("Authorization", b"Bearer " + TOKEN_MARK)
    kind = g.pick(("too-big", "declared-big", "chunked-big", "malformed", "bad-model", "no-registry", "origin"))
    target = _action_target(g)  # never an existing job: nothing is acted on
    if kind == "too-big":
        body = b'{"reason": "' + b"r" * g.pick((BIG_BODY, 200 << 10, 1 << 20)) + b'"}'
        return HttpStep("token, body over 64 KiB", _request("POST", target, headers=[auth], body=body), (413,))
    if kind == "declared-big":
        raw = _request("POST", target, headers=[auth], length=g.pick((10**10, BIG_BODY + 1, 2**62)))
        return HttpStep("token, declared body over 64 KiB", raw, (413,))
    if kind == "chunked-big":
        raw = _request("POST", target, headers=[auth], body=b" " * (100 << 10), chunked=True)
        return HttpStep("token, chunked body over 64 KiB", raw, (413,))
    if kind == "malformed":
        target = f"/api/registry/m/{g.pick(('promote', 'rollback'))}"
        label, body = g.pick(
            (("malformed", b'{"version": '), ("not-json", b"\xff\x00"), ("array", b"[1]"), ("deep", b"[" * 5000))
        )
        raw = _request("POST", target, headers=[auth, ("Content-Type", b"application/json")], body=body)
        return HttpStep(f"token, {label} body", raw, (400, 404, 422))
    if kind == "bad-model":
        model = g.pick(("a%00b", "%00", "..", "a%2Fb", "x" * 300, "%5Bbold%5D", "%C3%A9", "-x", "a%0Ab"))
        target = f"/api/registry/{model}/{g.pick(('promote', 'rollback'))}"
        body = b'{"version": "1", "reason": "fuzz"}'
        raw = _request("POST", target, headers=[auth, ("Content-Type", b"application/json")], body=body)
        return HttpStep("token, malformed model name", raw, (400, 404, 422))
    if kind == "no-registry":
        target = f"/api/registry/tabular-demo/{g.pick(('promote', 'rollback'))}"
        body = g.pick((b'{"version": "1", "reason": "fuzz"}', b'{"reason": "fuzz"}'))
        raw = _request("POST", target, headers=[auth, ("Content-Type", b"application/json")], body=body)
        return HttpStep("token, no registry", raw, (404, 409, 422))
    origin = ("Origin", g.pick((b"http://evil.example", b"null", b"http://127.0.0.1.evil.com:@PORT@")))
    raw = _request("POST", target, headers=[auth, origin], body=b'{"reason": "fuzz"}')
    return HttpStep("token, another origin", raw, (403,))


def _step_methods(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    method = g.pick(("HEAD", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH", "BREW", "get"))
    return HttpStep(f"method {method}", _request(method, g.pick(PLAIN_ROUTES), host=hosts.good()))


def _step_webhook(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    _, body = _json_body(g)
    headers = [("X-Gpufleet-Signature", b"sha256=" + b"0" * 64)] if g.chance(0.5) else []
    if g.chance(0.3):
        raw = _request("POST", "/hooks/alerts", host=hosts.good(), headers=headers, length=10**12)
    else:
        raw = _request("POST", "/hooks/alerts", host=hosts.good(), headers=headers, body=body)
    return HttpStep("webhook", raw, allow_503=True)


def _step_slow(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    raw = _request("GET", "/api/jobs", host=hosts.good())
    slow = g.pick((3, 8, 40, 90, 600))  # 600: past the server's connection cap (512), whose answer is a 503
    return HttpStep("GET beside half-sent heads", raw, (200, 503), allow_503=True, slow=slow)


def _step_teams(g: Gen, hosts: _Hosts, token: bool) -> HttpStep:
    raw = _request("GET", f"/api/{g.pick(('jobs', 'cost'))}?team=fuzz-team-@N@", host=hosts.good())
    return HttpStep("distinct teams", raw, (200,), repeat=g.pick((20, 60)))


HTTP_STEPS: tuple[tuple[Callable[[Gen, _Hosts, bool], HttpStep], int, bool], ...] = (
    (_step_plain, 3, False),
    (_step_foreign_host, 4, False),
    (_step_odd_host, 1, False),
    (_step_long_query, 2, False),
    (_step_hostile_query, 2, False),
    (_step_bad_number, 3, False),
    (_step_unauthenticated, 3, False),
    (_step_authenticated, 3, True),
    (_step_methods, 1, False),
    (_step_webhook, 1, False),
    (_step_slow, 1, False),
    (_step_teams, 1, False),
)
"""Step makers, their weights, and whether they need the server's token."""


def surface_serve_http(g: Gen) -> Draft:
    """``gpufleet serve`` on a free loopback port, sent raw requests: hostile Hosts, queries, bodies, slow heads.

    The runner checks each answer (:meth:`fuzz_runner.Runner._exchange`): its status, no 5xx, the
    security headers, no absolute path of the case's folder in the body; then stops the server.
    """
    argv = ["serve", "--port", "0", "--port-file", "port.txt"]
    private: tuple[str, ...] = ()
    mode = g.pick(("default", "file", "file", "none"))
    if mode == "none":
        argv.append("--no-token")
    elif mode == "file":
        argv += ["--token-file", g.add_file("serve.token", b"fuzz-token-" + b"t" * 40 + b"\n")]
        private = ("serve.token",)
    host = g.pick(("127.0.0.1", "127.0.0.1", "localhost"))
    if g.chance(0.3):
        argv += ["--host", host]
    allowed: list[str] = []
    if g.chance(0.3):
        allowed = g.rng.sample(ALLOWED_NAMES, g.rng.randint(1, 2))
        for name in allowed:
            argv += ["--allowed-host", name]
    if g.chance(0.3):
        argv += ["--cache", g.pick(("0", "1", "30"))]
    hosts = _Hosts(g, host, allowed)
    token = mode != "none"
    makers = [(make, weight) for make, weight, needs in HTTP_STEPS if token or not needs]
    steps = []
    for _ in range(g.rng.randint(4, 9)):
        make = g.rng.choices([m for m, _ in makers], weights=[w for _, w in makers])[0]
        steps.append(make(g, hosts, token))
    g.note(f"token: {mode}; allowed hosts: {allowed or 'loopback'}")
    g.notes.extend(step.describe() for step in steps)
    return Draft(
        argv,
        home=_home(g, hostile=False, p_empty=0.4),
        serves="port.txt",
        serves_path="",
        http=steps,
        private=private,
    )


# ---- sweep numerics, crafted DCP metadata, determinism seeds ------------------------------------


def _grid(n: int, *, start: float = 0.0) -> list[float]:
    return [start + i for i in range(n)]


SWEEP_STORAGES: tuple[str, ...] = (
    "bogus://x",
    "sqlite:////no/such/dir/study.db",
    "sqlite:///" + "d" * 300 + "/x.db",
    "sqlite:///:memory:",
    "",
    "sqlite://",
    "file:///etc/passwd",
    "sqlite:////dev/null",
    "sqlite:////proc/self/x.db",
    "mysql://u:p@127.0.0.1:1/db",
    "postgresql://u:p@127.0.0.1:1/db",
    "sqlite:///study.db?mode=ro",
)
"""``storage:`` and ``--storage`` values: refused (exit 2, no ``state.db``), a file inside the working folder, or an
unreachable server (exit 3)."""


def _sweep_space(g: Gen) -> tuple[dict[str, Any], str, bool]:
    """A hostile ``space:`` with its sampler kind, and whether the sweep must be refused."""
    kind = g.pick(
        (
            "huge-grid",
            "grid-over-ceiling",
            "grid-at-ceiling",
            "wide-range",
            "wide-int",
            "tiny-step",
            "huge-int",
            "log-zero",
            "log-negative",
            "non-finite",
            "huge-step",
            "many-params",
        )
    )
    g.note(f"space: {kind}")
    if kind == "huge-grid":  # 10^12 points: refused, never enumerated
        return {k: {"grid": _grid(10_000)} for k in ("a", "b", "c")}, "grid", True
    if kind == "grid-over-ceiling":
        return {"a": {"grid": _grid(10_000)}, "b": {"grid": _grid(11)}}, "grid", True
    if kind == "grid-at-ceiling":
        return {"a": {"grid": _grid(1_000)}, "b": {"grid": _grid(g.pick((2, 100)))}}, "grid", False
    if kind == "wide-range":
        low, high = g.pick(((-1e308, 1e308), (-1.7976931348623157e308, 1.7976931348623157e308), (0.0, 1e308)))
        return {"lr": {"low": low, "high": high}}, g.pick(("tpe", "random")), low < 0
    if kind == "wide-int":
        return {"n": {"low": -(2**63), "high": 2**63 - 1, "type": "int"}}, g.pick(("tpe", "random")), False
    if kind == "tiny-step":
        step = g.pick((1e-300, 5e-324, 1e-30))
        return {"lr": {"low": 0.0, "high": 1.0, "step": step}}, g.pick(("tpe", "random")), step < 1e-100
    if kind == "huge-int":
        low, high = g.pick(((0, 2**64), (-(2**70), 2**70), (0, 10**30), (2**63, 2**63 + 10)))
        param: dict[str, Any] = {"low": low, "high": high, "type": "int"}
        if g.chance(0.5):
            param["step"] = g.pick((1, 2**62, 10**20))
        return {"n": param}, g.pick(("tpe", "random")), True
    if kind == "log-zero":
        return {"lr": {"low": 0.0, "high": 1.0, "log": True}}, "tpe", True
    if kind == "log-negative":
        return {"lr": {"low": g.pick((-1.0, -1e308, -5e-324)), "high": 1.0, "log": True}}, "tpe", True
    if kind == "non-finite":
        field_, value = g.pick((("low", "__RAW_nan__"), ("high", "__RAW_inf__"), ("step", "__RAW_inf__")))
        param = {"low": 0.0, "high": 1.0, field_: value}
        if g.chance(0.3):
            return {"a": {"grid": [0.1, "__RAW_nan__"]}}, "grid", True
        return {"lr": param}, "tpe", True
    if kind == "huge-step":
        return {"lr": {"low": 0.0, "high": 1.0, "step": 1e308}}, "tpe", False
    return {f"p{i}": {"choices": [1, 2]} for i in range(g.pick((64, 65, 500)))}, "random", False


def surface_sweep_numerics(g: Gen) -> Draft:
    """``gpufleet sweep run``: grids past the trial ceiling, ±1e308 ranges, tiny steps, huge ints, odd storages."""
    base = example("sweep.yaml")
    base["budget"], base["parallelism"] = {"trials": 1}, 1
    base["base"]["args"].update(steps=2, eval_every=1)
    refuse = False
    if g.chance(0.8):
        space, sampler, refuse = _sweep_space(g)
        base["space"], base["sampler"] = space, {"kind": sampler, "seed": 0}
    if g.chance(0.3):
        base["budget"] = {"trials": g.pick((10**30, 2**63, 100_001, 0, -1))}
        refuse = True
    service = False
    if g.chance(0.35):
        base["storage"] = g.pick(SWEEP_STORAGES)
        service = base["storage"].startswith(("mysql", "postgresql"))
        g.note(f"storage: {base['storage']!r}")
    raws = {"__RAW_nan__": ".nan", "__RAW_inf__": ".inf"}
    text = yaml.safe_dump(base, sort_keys=False, width=10**9)
    for mark, raw in raws.items():
        text = text.replace(f"'{mark}'", raw).replace(mark, raw)
    sweep = g.add_file(g.name("sweep", ".yaml"), text.encode())
    if g.chance(0.15):
        name = g.arg_string("lm-sweep", p_valid=0.8)
        which = g.pick(("show", "best", "note"))
        argv = ["sweep", which, name, "--storage", g.pick(SWEEP_STORAGES)]
        if which == "best":
            argv += ["--out", g.out_path("best", ".yaml")]
        return Draft(argv, home=_home(g, hostile=False, p_empty=0.7), service_exit_ok=True)
    argv = ["sweep", "run", sweep, "--once", *_maybe(g, 0.3, "--json")]
    return Draft(argv, home=_home(g, hostile=False, p_empty=0.6), service_exit_ok=service, must_refuse=refuse)


def dcp_checkpoint(g: Gen, variant: str | None) -> dict[str, FileContent]:
    """The sharded template under ``ck/`` with its ``.metadata`` replaced by ``variant``'s (manifest re-hashed),
    a copy of its shard outside the step folder (``ck/`` and the working folder), and a FIFO beside them."""
    files: dict[str, FileContent] = {f"ck/{k}": v for k, v in g.templates.under("dcp/").items()}
    shard = files.get(f"ck/{DCP_STEP}/__0_0.distcp")
    if isinstance(shard, bytes):
        files[f"ck/{DCP_OUTSIDE}"] = shard
        files[DCP_OUTSIDE] = shard
        if variant == "unlisted":
            files[f"ck/{DCP_STEP}/__9_0.distcp"] = shard
    files["outside.fifo"] = Special("fifo")
    crafted = g.templates.files.get(f"dcp-meta/{variant}.metadata") if variant else None
    manifest_name = f"ck/{DCP_STEP}/manifest.json"
    raw = files.get(manifest_name)
    if crafted is not None and isinstance(raw, bytes):
        manifest = json.loads(raw)
        files[f"ck/{DCP_STEP}/.metadata"] = crafted
        manifest["files"][".metadata"] = {"sha256": hashlib.sha256(crafted).hexdigest(), "bytes": len(crafted)}
        files[manifest_name] = json.dumps(manifest, indent=2, sort_keys=True).encode()
    return files


def surface_ckpt_dcp(g: Gen) -> Draft:
    """``gpufleet ckpt verify|export|list`` on a sharded checkpoint with a crafted ``.metadata`` (manifest re-hashed).

    Metadata that names a file the manifest does not list must be refused by ``verify`` and
    ``export`` (exit 1 or 2, one stderr line, no warning) without the outside copy of the shard
    being read: were it read, the export would succeed. Broken offsets or pickles: ``export`` refuses.
    """
    variant = None if g.chance(0.12) else g.pick(sorted(DCP_VARIANTS))
    g.note(f"dcp metadata: {variant or 'intact'}")
    for name, content in dcp_checkpoint(g, variant).items():
        g.add_file(name, content)
    which = g.pick(("verify", "verify", "export", "export", "list"))
    argv = ["ckpt", which, "ck"]
    if which == "export":
        argv += ["--out", "model.pt", *_maybe(g, 0.4, "--step", "10")]
        argv += _maybe(g, 0.3, "--entry", g.pick(("model", "trainer")))
    argv += _maybe(g, 0.4, "--json")
    kind = DCP_VARIANTS.get(variant or "")
    refuse = (kind == "outside" and which != "list") or (kind == "broken" and which == "export")
    return Draft(argv, must_refuse=refuse, quiet=True)


SEED_VALUES: tuple[tuple[str, bool], ...] = (
    (f"{2**64},1", True),
    (f"1,{2**64}", True),
    (f"{2**64 + 1},0", True),
    ("1" + "0" * 400 + ",1", True),
    ("-1,0", True),
    ("0,-1", True),
    (f"{-(2**63)},1", True),
    ("1.5,2", True),
    ("1e3,1", True),
    ("nan,1", True),
    ("inf,1", True),
    ("0x10,1", True),
    ("\u0661,2", True),
    ("1_000,2", True),
    ("+1,2", True),
    ("1,2,3", True),
    (",", True),
    ("", True),
    (f"{2**63},1", False),
    (f"{2**63 - 1},1", False),
    (f"{2**32},{2**32 - 1}", False),
    ("0,1", False),
    ("5,5", False),
)
"""``--seeds`` values, and whether ``debug determinism`` must refuse them (others may run or be refused)."""


def surface_determinism_seeds(g: Gen) -> Draft:
    """``gpufleet debug determinism SPEC --steps 2 --seeds A,B``: seeds past 2^64, negative, not integers."""
    args: dict[str, Any] = {"steps": 3, "step_seconds": 0}
    spec = {"name": "toy", "entrypoint": "gpufleet.workloads.toy:train", "args": args}
    refuse = False
    if g.chance(0.2):
        seed = g.pick((2**64, 2**70, -1, 10**400 if g.chance(0.2) else 2**63, "1", 1.5))
        args["seed"] = seed
        g.note(f"spec seed {_short(seed)}")
    spec_file = g.add_file("spec.yaml", yaml.safe_dump(spec).encode())
    argv = ["debug", "determinism", spec_file, "--steps", g.pick(("2", "2", "1"))]
    if g.chance(0.9):
        seeds, refuse = g.pick(SEED_VALUES)
        argv += ["--seeds", seeds]
    argv += _maybe(g, 0.3, "--json")
    return Draft(argv, must_refuse=refuse)


SURFACES: dict[str, Callable[[Gen], Draft]] = {
    "spec-submit": surface_spec_submit,
    "spec-export": surface_spec_export,
    "spec-run": surface_spec_run,
    "batch-place": surface_batch_place,
    "catalog": surface_catalog,
    "workload": surface_workload,
    "rates": surface_rates,
    "fleet-topology": surface_fleet,
    "slo": surface_slo,
    "estimate": surface_estimate,
    "estimate-allreduce": surface_estimate_allreduce,
    "drift": surface_drift,
    "scrape": surface_scrape,
    "gpu-log": surface_gpu_log,
    "job-events": surface_job_events,
    "home-db": surface_home_db,
    "home-env": surface_home_env,
    "goodput": surface_goodput,
    "fleet-pools": surface_fleet_pools,
    "ckpt": surface_ckpt,
    "job-ids": surface_job_ids,
    "spikes-csv": surface_spikes_csv,
    "registry": surface_registry,
    "service-ops": surface_service_ops,
    "webhook": surface_webhook,
    "exporter": surface_exporter,
    "out-paths": surface_out_paths,
    "long-parse": surface_long_parse,
    "sweep": surface_sweep,
    "monitor": surface_monitor,
    "bench-disk": surface_bench_disk,
    "bench-net": surface_bench_net,
    "bench-stage": surface_bench_stage,
    "serve": surface_serve,
    "serve-http": surface_serve_http,
    "sweep-numerics": surface_sweep_numerics,
    "ckpt-dcp": surface_ckpt_dcp,
    "seeds": surface_determinism_seeds,
}
SURFACE_WEIGHTS: dict[str, int] = {
    "spec-submit": 3,
    "spec-export": 3,
    "spec-run": 1,
    "batch-place": 2,
    "catalog": 2,
    "workload": 2,
    "rates": 2,
    "fleet-topology": 2,
    "slo": 1,
    "estimate": 3,
    "estimate-allreduce": 1,
    "drift": 3,
    "scrape": 2,
    "gpu-log": 2,
    "job-events": 4,
    "home-db": 1,
    "home-env": 1,
    "goodput": 2,
    "fleet-pools": 2,
    "ckpt": 3,
    "job-ids": 3,
    "spikes-csv": 1,
    "registry": 1,
    "service-ops": 1,
    "webhook": 2,
    "exporter": 1,
    "out-paths": 1,
    "long-parse": 1,
    "sweep": 2,
    "monitor": 2,
    "bench-disk": 1,
    "bench-net": 1,
    "bench-stage": 1,
    "serve": 1,
    "serve-http": 1,
    "sweep-numerics": 1,
    "ckpt-dcp": 1,
    "seeds": 1,
}


def _interleave(weights: dict[str, int]) -> tuple[str, ...]:
    """Every surface ``weight`` times, spread out (a surface's turns are as far apart as they can be)."""
    slots = sorted(((i + 0.5) / w, name) for name, w in weights.items() for i in range(w))
    return tuple(name for _, name in slots)


SURFACE_ORDER: tuple[str, ...] = _interleave(SURFACE_WEIGHTS)
"""Case ``index`` belongs to ``SURFACE_ORDER[index % len(SURFACE_ORDER)]``."""


def surface_of(index: int) -> str:
    return SURFACE_ORDER[index % len(SURFACE_ORDER)]


def make_case(seed: int, index: int, templates: Templates | None = None) -> Case:
    """Case ``index`` of run ``seed``: a pure function of both (and of the templates)."""
    surface = surface_of(index)
    g = Gen(random.Random(f"{seed}:{index}"), templates or Templates())
    draft = SURFACES[surface](g)
    return Case(
        seed=seed,
        index=index,
        surface=surface,
        argv=draft.argv,
        files=g.files,
        home=draft.home,
        env=g.env,
        target=draft.target,
        serves=draft.serves,
        serves_path=draft.serves_path,
        service_exit_ok=draft.service_exit_ok,
        notes=g.notes,
        http=draft.http,
        private=draft.private,
        must_refuse=draft.must_refuse,
        quiet=draft.quiet,
    )


def main(argv: Sequence[str]) -> int:
    """``fuzz_cases.py --templates DIR`` builds the templates; ``--show SEED INDEX`` prints a case."""
    if len(argv) == 2 and argv[0] == "--templates":
        build_templates(Path(argv[1]))
        return 0
    if len(argv) == 3 and argv[0] == "--show":
        case = make_case(int(argv[1]), int(argv[2]))
        print(
            json.dumps(
                {"surface": case.surface, "argv": case.argv, "files": case.describe_files(), "notes": case.notes}
            )
        )
        return 0
    print("usage: fuzz_cases.py --templates DIR | --show SEED INDEX", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
