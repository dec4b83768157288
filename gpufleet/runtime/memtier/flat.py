"""The bytes of one memory copy: every tensor in one flat region, everything else as tagged JSON.

::

    offset 0    "GFFLAT1\\n" | data bytes (8) | index bytes (8) | pickled bytes (8) | zeros up to 64
    offset 64   the tensors' bytes, each at an offset aligned to 64, a dense tensor's strides kept
    then        the index, JSON: {"tensors": [[dtype, shape, stride, offset], ...], "state": <tagged tree>}
    then        torch.save of the few values the tagged tree cannot name (usually none)

Why not ``torch.save`` of the whole state: its pickler runs in Python for every object and storage
and held the GIL for about 10 ms a snapshot of a few MB, against the training thread. Here a
snapshot is a ``copy_`` of each tensor into views of one buffer kept between snapshots (pinned
when a tensor came from a GPU), and the write is that buffer and a small index, in system calls
that release the GIL. A restore maps the file and makes every tensor a view of the mapping.

The tagged tree: JSON ``null``, booleans, numbers, strings and arrays (lists) stand for
themselves; ``{"t": [...]}`` is a tuple, ``{"d": [[key, value], ...]}`` a dict (any key type,
order kept), ``{"o": [[key, value], ...], "m": tree}`` an ``OrderedDict`` and its ``_metadata``
(what ``load_state_dict`` reads), ``{"x": i}`` the i-th tensor (two references to one tensor stay
one tensor), ``{"p": i}`` the i-th value of the pickled part. Reading a copy unpickles nothing but
that part, with ``torch.load(weights_only=True)``; every index entry is bounds-checked.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import math
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.runtime.memtier.copies import OtherFormat

MAGIC = b"GFFLAT1\n"
_PREFIX = struct.Struct(">8sQQQ")
DATA_AT = 64
"""Where the tensors' bytes start: a mapping's page plus 64 keeps every tensor aligned."""
ALIGN = 64
_SCALARS = (type(None), bool, int, float, str)
MAX_DIMS = 64


@dataclass(frozen=True, slots=True)
class Staged:
    """A snapshot ready to write: its tensors' bytes (a view of the stager's buffer) and the rest.

    ``tree`` and ``entries`` are new containers of immutable values, and ``others`` deep copies,
    so the training loop may change its state at once; ``synced`` is the CUDA event the writer
    waits on before reading ``data`` (``None``: every tensor was on the CPU).
    """

    data: memoryview
    entries: list[list[Any]]
    entries_json: str
    """``entries`` as JSON, made once per layout."""
    tree: Any
    others: list[Any]
    synced: Any = None

    def tail(self) -> bytes:
        """The index and the pickled part: what follows the tensors' bytes."""
        tree = json.dumps(self.tree, separators=(",", ":"), check_circular=False)
        index = f'{{"tensors":{self.entries_json},"state":{tree}}}'.encode()
        pickled = b""
        if self.others:
            import torch

            buffer = io.BytesIO()
            torch.save(self.others, buffer)
            pickled = buffer.getvalue()
        return _PREFIX.pack(MAGIC, len(self.data), len(index), len(pickled)) + index + pickled

    def pieces(self, tail: bytes) -> Iterator[memoryview]:
        """The copy's bytes in order: the prefix (padded to ``DATA_AT``), the tensors, the index and pickled part."""
        prefix = tail[: _PREFIX.size]
        yield memoryview(prefix + bytes(DATA_AT - len(prefix)))
        if len(self.data):
            yield self.data
        yield memoryview(tail)[_PREFIX.size :]


class Stager:
    """Copies a state's tensors into one buffer, allocated once and grown when a state outgrows it.

    The views of the buffer are kept with the tensors' layout they were made for: a state of the
    same tensors as the last one (every snapshot but the first) is copied with one
    ``torch._foreach_copy_``, the only cost a snapshot adds to the training thread besides the
    walk over the state's containers.
    """

    def __init__(self) -> None:
        self._buffer: Any = None
        self.allocations = 0
        """Buffers allocated so far (a second one only when the state grew)."""
        self._layout: list[tuple[Any, ...]] = []
        self._entries: list[list[Any]] = []
        self._entries_json = "[]"
        self._views: list[Any] = []
        self._total = 0

    def stage(self, state: Any) -> Staged:
        """The state's tensors copied into the buffer (a GPU's asynchronously), the rest as a tagged tree."""
        import torch

        tensors: list[Any] = []
        layout: list[tuple[Any, ...]] = []
        others: list[Any] = []
        seen: dict[tuple[Any, ...], int] = {}

        plain, strided = (torch.Tensor, torch.nn.Parameter), torch.strided

        def leaf(item: Any) -> Any:
            if type(item) in plain and item.layout is strided and not (item.is_meta or item.is_quantized):
                form = (item.dtype, item.shape, item.stride(), item.is_cuda)
                key = (item.data_ptr(), form)
                if key in seen and item.numel():
                    return {"x": seen[key]}  # one tensor twice (tied weights): one copy, one tensor again
                seen[key] = len(tensors)
                tensors.append(item)
                layout.append(form)
                return {"x": len(tensors) - 1}
            container = subclass_tree(item, leaf)
            if container is not None:
                return container
            others.append(copy.deepcopy(item))
            return {"p": len(others) - 1}

        tree = build_tree(state, leaf)
        cuda = any(form[3] for form in layout)
        if layout != self._layout or self._buffer is None:
            self._plan(tensors, layout, pin=cuda and torch.cuda.is_available())
        sources = [t for t in tensors if t.numel()]
        if sources:
            with torch.no_grad():
                torch._foreach_copy_(self._views, sources, non_blocking=cuda)
        synced = None
        if cuda and torch.cuda.is_available():
            synced = torch.cuda.Event()  # type: ignore[no-untyped-call]
            synced.record()
        return Staged(
            data=self._data(),
            entries=self._entries,
            entries_json=self._entries_json,
            tree=tree,
            others=others,
            synced=synced,
        )

    def _plan(self, tensors: list[Any], layout: list[tuple[Any, ...]], *, pin: bool) -> None:
        """Where each tensor goes in the buffer (grown or pinned when it must be), and the views to copy into."""
        import torch

        entries, total = _layout(tensors)
        held = self._buffer
        if held is None or held.numel() < total or (pin and not held.is_pinned()):
            self._buffer = torch.empty(max(total, 1), dtype=torch.uint8, pin_memory=pin)
            self.allocations += 1
        self._views = [
            _view(self._buffer, offset, tensor.dtype, shape, stride)
            for tensor, (_, shape, stride, offset) in zip(tensors, entries, strict=True)
            if tensor.numel()
        ]
        self._layout, self._entries, self._total = layout, entries, total
        self._entries_json = json.dumps(entries, separators=(",", ":"))

    def _data(self) -> memoryview:
        if not self._total:
            return memoryview(b"")
        return memoryview(self._buffer.numpy()).cast("B")[: self._total]


def _layout(tensors: list[Any]) -> tuple[list[list[Any]], int]:
    """Each tensor's index entry ``[dtype, shape, stride, offset]`` and the bytes of the data region."""
    entries, offset = [], 0
    for tensor in tensors:
        shape = list(tensor.shape)
        stride = list(tensor.stride()) if _dense(shape, list(tensor.stride())) else _contiguous(shape)
        entries.append([str(tensor.dtype).removeprefix("torch."), shape, stride, offset])
        offset += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    return entries, offset


def _contiguous(shape: list[int]) -> list[int]:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return stride[::-1]


def _dense(shape: list[int], stride: list[int]) -> bool:
    """Whether a tensor of ``shape`` and ``stride`` covers exactly its elements, without holes or overlap."""
    expected = 1
    for size, step in sorted(((s, st) for s, st in zip(shape, stride, strict=True) if s != 1), key=lambda x: x[1]):
        if step != expected:
            return False
        expected *= size
    return all(s > 0 for s in shape)


def _view(region: Any, offset: int, dtype: Any, shape: list[int], stride: list[int]) -> Any:
    count = 1
    for size in shape:
        count *= size
    nbytes = count * dtype.itemsize
    return region[offset : offset + nbytes].view(dtype).as_strided(shape, stride)


@functools.cache
def _dtypes() -> dict[str, Any]:
    import torch

    found = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
    return {str(d).removeprefix("torch."): d for d in found.values() if d.itemsize >= 1}


def load(buffer: Any) -> Any:
    """The state in a copy's bytes (a writable buffer: a private mapping, a bytearray), its tensors views of it.

    The bytes are assumed verified against their header; their structure is still checked, and
    ``OtherFormat`` (a ``CorruptCopy``) names what does not hold.
    """
    try:
        return _load(buffer)
    except OtherFormat:
        raise
    except Exception as err:  # noqa: BLE001 - whatever else a copy's bytes make fail means "not one of ours"
        raise OtherFormat(f"the copy does not load ({err.__class__.__name__})") from None


def _load(buffer: Any) -> Any:
    import torch

    with memoryview(buffer) as view:
        if len(view) < DATA_AT or bytes(view[: len(MAGIC)]) != MAGIC:
            raise OtherFormat("the copy is not in this version's format")
        _, data_bytes, index_bytes, pickled_bytes = _PREFIX.unpack_from(view)
        if DATA_AT + data_bytes + index_bytes + pickled_bytes != len(view):
            raise OtherFormat(f"the copy's parts do not add up to its {len(view)} bytes")
        start = DATA_AT + data_bytes
        raw_index = bytes(view[start : start + index_bytes])
        pickled = bytes(view[start + index_bytes :])
    try:
        index = json.loads(raw_index.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise OtherFormat("the copy's index is not JSON") from None
    if not isinstance(index, dict) or not isinstance(index.get("tensors"), list) or "state" not in index:
        raise OtherFormat("the copy's index names no tensors or state")
    dtypes = _dtypes()
    tensors = [_entry_tensor(buffer, data_bytes, entry, dtypes) for entry in index["tensors"]]
    others: Any = []
    if pickled:
        try:
            others = torch.load(io.BytesIO(pickled), map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
            raise OtherFormat(f"the copy's pickled part does not load ({err.__class__.__name__})") from None
        if not isinstance(others, list):
            raise OtherFormat("the copy's pickled part is not a list")
    return read_tree(index["state"], tensors, others)


def _entry_tensor(buffer: Any, data_bytes: int, entry: Any, dtypes: dict[str, Any]) -> Any:
    """One index entry's tensor, its dtype known and its bytes inside the data region.

    Each tensor is a storage of its own over ``buffer`` (offset 0 in it, as ``torch.load`` gives):
    some readers of a tensor (``torch.set_rng_state``) read its storage from the start.
    """
    import torch

    if not isinstance(entry, list) or len(entry) != 4:
        raise OtherFormat("a tensor entry of the copy's index is not [dtype, shape, stride, offset]")
    name, shape, stride, offset = entry
    dtype = dtypes.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise OtherFormat(f"a tensor of the copy has the unknown dtype {str(name)[:40]!r}")
    ints = [offset, *shape, *stride] if isinstance(shape, list) and isinstance(stride, list) else None
    if ints is None or len(shape) != len(stride) or len(shape) > MAX_DIMS:
        raise OtherFormat("a tensor entry of the copy's index has a bad shape or stride")
    if any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 50 for v in ints):
        raise OtherFormat("a tensor entry of the copy's index holds a value that is not a small integer")
    empty = any(size == 0 for size in shape)
    span = 0 if empty else (1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True)))
    if offset % ALIGN or offset + span * dtype.itemsize > data_bytes:
        raise OtherFormat("a tensor of the copy lies outside its data region")
    if not empty and math.prod(shape) != span:  # a copy holds dense tensors: no element read twice
        raise OtherFormat("a tensor entry of the copy's index overlaps itself")
    if empty:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype, count=span, offset=DATA_AT + offset).as_strided(shape, stride)


# ---- the tagged tree -------------------------------------------------------------------------
def build_tree(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` as a tagged tree (module docstring); ``leaf`` gives the node of any other value.

    Exact types first, the common ones first: a state is mostly dicts of tensors and numbers.
    """
    kind = type(value)
    if kind is dict:
        return {"d": [[k if type(k) is str else build_tree(k, leaf), build_tree(v, leaf)] for k, v in value.items()]}
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        items = list(value) if all(type(v) in _SCALARS for v in value) else [build_tree(v, leaf) for v in value]
        return items if kind is list else {"t": items}
    if kind is OrderedDict:
        node = {"o": [[k if type(k) is str else build_tree(k, leaf), build_tree(v, leaf)] for k, v in value.items()]}
        meta = getattr(value, "_metadata", None)
        if meta is not None:
            node["m"] = build_tree(meta, leaf)
        return node
    return leaf(value)


def subclass_tree(value: Any, leaf: Callable[[Any], Any]) -> Any | None:
    """The node of another mapping (a dict, as a copy always made of one), list or tuple; ``None`` otherwise."""
    if isinstance(value, Mapping):
        return build_tree(dict(value.items()), leaf)
    if isinstance(value, list):
        return build_tree(list(value), leaf)
    if isinstance(value, tuple):
        return build_tree(tuple(value), leaf)
    return None


def read_tree(tree: Any, tensors: list[Any], others: list[Any]) -> Any:
    """The value a tagged tree stands for; ``OtherFormat`` for a node that is not one of the tags."""
    try:
        return _read(tree, tensors, others)
    except RecursionError:
        raise OtherFormat("the copy's state tree is nested too deeply") from None


def _read(node: Any, tensors: list[Any], others: list[Any]) -> Any:
    kind = type(node)
    if kind in _SCALARS:
        return node
    if kind is list:
        return node if all(type(v) in _SCALARS for v in node) else [_read(v, tensors, others) for v in node]
    if kind is dict and len(node) == 1 and isinstance(node.get("t"), list):
        return tuple(_read(v, tensors, others) for v in node["t"])
    if kind is dict and len(node) == 1 and isinstance(node.get("d"), list):
        return dict(_pairs(node["d"], tensors, others))
    if kind is dict and 1 <= len(node) <= 2 and isinstance(node.get("o"), list) and set(node) <= {"o", "m"}:
        out = OrderedDict(_pairs(node["o"], tensors, others))
        if "m" in node:
            meta = _read(node["m"], tensors, others)
            if not isinstance(meta, dict):
                raise OtherFormat("the copy's state tree holds metadata that is not a mapping")
            out._metadata = meta  # type: ignore[attr-defined]
        return out
    for tag, values in (("x", tensors), ("p", others)):
        if kind is dict and len(node) == 1 and tag in node:
            at = node[tag]
            if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < len(values):
                raise OtherFormat(f"the copy's state tree names a {tag!r} entry it does not hold")
            return values[at]
    raise OtherFormat("the copy's state tree holds a node that is not one of its tags")


def _pairs(items: list[Any], tensors: list[Any], others: list[Any]) -> Iterator[tuple[Any, Any]]:
    for item in items:
        if type(item) is not list or len(item) != 2:
            raise OtherFormat("an entry of a mapping in the copy's state tree is not [key, value]")
        key = _read(item[0], tensors, others)
        try:
            hash(key)
        except TypeError:
            raise OtherFormat("a key of a mapping in the copy's state tree is not hashable") from None
        yield key, _read(item[1], tensors, others)


def own_tensors(state: Any) -> Any:
    """``state`` with every tensor cloned (one tensor named twice, cloned once): nothing keeps the buffer alive."""
    import torch

    clones: dict[int, Any] = {}

    def own(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in clones:
                clones[id(value)] = value.clone()
            return clones[id(value)]
        if isinstance(value, OrderedDict):
            out = OrderedDict((k, own(v)) for k, v in value.items())
            if hasattr(value, "_metadata"):
                out._metadata = value._metadata  # type: ignore[attr-defined]
            return out
        if isinstance(value, dict):
            return {k: own(v) for k, v in value.items()}
        if isinstance(value, list):
            return [own(v) for v in value]
        if type(value) is tuple:
            return tuple(own(v) for v in value)
        return value

    return own(state)


__all__ = ["MAGIC", "Staged", "Stager", "build_tree", "load", "own_tensors", "read_tree", "subclass_tree"]
