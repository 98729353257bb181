"""Checks an ONNX file must pass before shape inference or ONNX Runtime sees it.

An ONNX file is untrusted data, and a few hundred bytes of it can declare gigabytes: a
``ConstantOfShape`` of ``[2**40]`` makes shape inference and ORT's constant folding allocate the
tensor, an initializer whose dims are ``[-1, 10**9]`` makes every byte count negative, a ``Loop``
with a trip count of ``2**62`` never ends. ``load_checked`` reads the file (a regular file only:
a FIFO would block for ever) and walks every graph, subgraph and local function:

- every tensor stored in the file (initializers, ``Constant`` values, attribute tensors): dims
  ``>= 0``, at most ``MAX_TENSOR_BYTES``, and data of exactly the declared size, in the file or in
  an external file beside the model (a regular file, inside the model's folder, long enough);
- every declared value shape (inputs, outputs, ``value_info``): dims ``>= 0`` and at most
  ``MAX_TENSOR_BYTES`` where fully known;
- every tensor the graph computes from its own constants before any input is known
  (``ConstantOfShape``, ``Expand``, ``Tile``, ``Range`` on constant operands), which shape inference
  and ORT's constant folding materialize: at most ``MAX_FOLDED_BYTES``;
- control flow: a ``Loop`` whose trip count is not a constant of at most ``MAX_LOOP_TRIPS`` is
  *unbounded*; the caller runs such a model under a time and memory limit of its own.

``MAX_TENSOR_BYTES`` is the smaller of 1 TiB and this machine's physical memory (a tensor that
cannot exist here cannot be run or planned for here). Every failure is one ``InputError`` whose
text is terminal-safe (names from the file are escaped).
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.untrusted import read_regular, terminal_safe

__all__ = [
    "MAX_FOLDED_BYTES",
    "MAX_LOOP_TRIPS",
    "MAX_MODEL_BYTES",
    "ModelCheck",
    "check_model",
    "check_regular",
    "load_checked",
    "max_tensor_bytes",
    "memory_limited",
    "vm_size",
]

MAX_MODEL_BYTES = 2 * 1024**3  # protobuf's own limit for one message
MAX_FOLDED_BYTES = 256 * 1024**2  # one tensor computed from the graph's constants before the run
MAX_LOOP_TRIPS = 1 << 20  # a Loop with a constant trip count up to this runs like any other node
_MAX_ELEMENTS = 1 << 40
_MAX_DEPTH = 32  # nested subgraphs


def max_tensor_bytes() -> int:
    """The largest tensor this machine could hold: its physical memory, at most 1 TiB."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 1 << 40
    return int(min(phys, 1 << 40))


def _safe(text: object, limit: int = 80) -> str:
    s = terminal_safe(text)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def check_regular(path: str | Path, what: str, max_bytes: int | None = None) -> int:
    """The size of ``path``, a regular file (``InputError`` for a FIFO, device, directory or a
    missing file). Opened without blocking, so a FIFO is refused instead of waited on."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{_safe(p, 200)}: no such file ({what})") from None
    except OSError as exc:
        raise InputError(f"{_safe(p, 200)}: cannot open ({exc.strerror or type(exc).__name__}; {what})") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO, device or socket"
        raise InputError(f"{_safe(p, 200)}: not a regular file ({kind}); expected {what}")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputError(f"{_safe(p, 200)}: {st.st_size} bytes, over the {max_bytes}-byte limit for {what}")
    return int(st.st_size)


@dataclass
class ModelCheck:
    """What the walk found that the caller must act on."""

    unbounded: list[str] = field(default_factory=list)  # "Loop 'name'" of each unbounded control-flow node
    tensors: int = 0
    nodes: int = 0


def load_checked(
    path: str | Path, *, what: str = "ONNX model", external_folder: Path | None = None
) -> tuple[Any, ModelCheck]:
    """Read and check the ONNX file at ``path``: (``onnx.ModelProto`` without external data, check).
    External data must lie in ``external_folder`` (default: the model's own folder)."""
    import onnx
    from google.protobuf.message import DecodeError

    p = Path(path)
    raw = read_regular(p, MAX_MODEL_BYTES, what=what)
    try:
        model = onnx.load_from_string(raw)
    except (DecodeError, ValueError, RuntimeError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{_safe(p, 200)}: not an ONNX model ({_safe(first, 200)})") from None
    del raw
    return model, check_model(model, external_folder or p.parent, label=_safe(p.name, 120))


def check_model(model: Any, folder: Path | None, *, label: str = "model") -> ModelCheck:
    """Walk ``model`` (an ``onnx.ModelProto``); ``InputError`` at the first declared size this
    machine cannot hold. ``folder`` is where external data must lie (None: external data refused)."""
    walker = _Walker(folder, label)
    graph = model.graph
    if not graph.node:
        raise InputError(f"{label}: the ONNX graph has no nodes")
    walker.graph(graph, 0)
    for fn in model.functions:
        walker.nodes(fn.node, {}, 0, f"function {_safe(fn.name)}")
    return walker.check


def _itemsize(elem_type: int) -> int:
    from onnx import helper

    if elem_type == 8:  # STRING: no fixed size; counted as one byte per element here
        return 1
    try:
        return int(helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except (KeyError, ValueError, TypeError):
        return 1  # UNDEFINED or an unknown type: ORT refuses those itself


class _Walker:
    def __init__(self, folder: Path | None, label: str) -> None:
        self.folder, self.label = folder, label
        self.limit = max_tensor_bytes()
        self.check = ModelCheck()

    def fail(self, where: str, why: str) -> InputError:
        return InputError(f"{self.label}: {where}: {why}")

    def count(self, dims: Any, itemsize: int, where: str, limit: int | None = None) -> int:
        """Bytes of a tensor of ``dims``; refused past the limit (or for a negative dim)."""
        limit = self.limit if limit is None else limit
        n = 1
        for d in dims:
            d = int(d)
            if d < 0:
                raise self.fail(where, f"dimension {d} is negative")
            n *= d
            if n > _MAX_ELEMENTS:
                raise self.fail(where, f"declares more than 2^40 elements (dims {_safe(list(dims), 60)})")
        if n * itemsize > limit:
            of = "this machine's memory" if limit == self.limit else "a tensor folded from the graph's constants"
            raise self.fail(where, f"declares {n * itemsize:,} bytes, over the limit of {limit:,} for {of}")
        return n * itemsize

    def tensor(self, t: Any, where: str) -> None:
        from onnx import TensorProto

        self.check.tensors += 1
        if not isinstance(t.name, str):
            raise self.fail(where, "a tensor name that is not valid UTF-8")
        where = f"{where} tensor {_safe(t.name)!r}" if t.name else where
        size = self.count(t.dims, _itemsize(t.data_type), where)
        n = math.prod(int(d) for d in t.dims)
        if t.data_location == TensorProto.EXTERNAL:
            self.external(t, size, where)
            return
        if t.data_type == 8:
            if len(t.string_data) != n:
                raise self.fail(where, f"holds {len(t.string_data)} strings for {n} elements")
            return
        if t.raw_data:
            if len(t.raw_data) != size and t.data_type not in (22, 21):  # int4/uint4 pack two per byte
                raise self.fail(where, f"holds {len(t.raw_data)} bytes of data for dims {list(t.dims)} ({size} bytes)")
            return
        held = max(len(t.float_data), len(t.int32_data), len(t.int64_data), len(t.double_data), len(t.uint64_data))
        if held not in (0, n) and not (t.data_type in (14, 15) and held == 2 * n):  # complex: two per element
            if t.data_type not in (22, 21, 23, 24, 25):  # packed sub-byte types
                raise self.fail(where, f"holds {held} values for dims {list(t.dims)} ({n} elements)")

    def external(self, t: Any, size: int, where: str) -> None:
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        if self.folder is None:
            raise self.fail(where, "refers to external data, which bytes given in memory cannot have")
        if not location or os.path.isabs(location) or ".." in Path(location).parts:
            raise self.fail(where, f"external data {_safe(location)!r} must be a file inside the model's folder")
        try:
            offset = int(info.get("offset", "0") or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise self.fail(where, "external data offset/length are not integers") from None
        if offset < 0 or (length is not None and length != size):
            raise self.fail(where, f"external data offset {offset}, length {length}: dims and type need {size} bytes")
        file_size = check_regular(self.folder / location, f"external data of {self.label}")
        if offset + size > file_size:
            raise self.fail(
                where, f"external data {_safe(location)!r} holds {file_size} bytes; the tensor needs {offset + size}"
            )

    def shape(self, v: Any, where: str) -> None:
        if not isinstance(v.name, str):
            raise self.fail(where, "a value name that is not valid UTF-8")
        t = v.type.tensor_type if v.type.HasField("tensor_type") else None
        if t is None or not t.HasField("shape"):
            return
        dims = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                if d.dim_value < 0:
                    raise self.fail(f"{where} {_safe(v.name)!r}", f"dimension {d.dim_value} is negative")
                dims.append(d.dim_value)
            else:
                return
        self.count(dims, _itemsize(t.elem_type), f"{where} {_safe(v.name)!r}")

    def graph(self, g: Any, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise self.fail("graph", f"subgraphs nested deeper than {_MAX_DEPTH}")
        consts: dict[str, Any] = {}
        for t in g.initializer:
            self.tensor(t, "initializer")
            consts[t.name] = t
        for s in g.sparse_initializer:
            self.tensor(s.values, "sparse initializer")
            self.tensor(s.indices, "sparse initializer")
            self.count(s.dims, 1, "sparse initializer")
        for v in (*g.input, *g.output, *g.value_info):
            self.shape(v, "value")
        self.nodes(g.node, consts, depth, "node")

    def nodes(self, nodes: Any, consts: dict[str, Any], depth: int, kind: str) -> None:
        from onnx import AttributeProto

        for node in nodes:
            self.check.nodes += 1
            if not all(isinstance(x, str) for x in (node.name, node.op_type, node.domain, *node.input, *node.output)):
                raise self.fail(f"{kind} {self.check.nodes}", "a name that is not valid UTF-8")
            where = f"{kind} {_safe(node.name or node.op_type)!r} ({_safe(node.op_type, 40)})"
            for a in node.attribute:
                if a.type == AttributeProto.TENSOR:
                    self.tensor(a.t, where)
                for t in a.tensors:
                    self.tensor(t, where)
                if a.type == AttributeProto.GRAPH:
                    self.graph(a.g, depth + 1)
                for sub in a.graphs:
                    self.graph(sub, depth + 1)
            if node.op_type == "Constant" and node.output:
                for a in node.attribute:
                    if a.name == "value" and a.type == AttributeProto.TENSOR:
                        consts[node.output[0]] = a.t
            if node.domain in ("", "ai.onnx"):
                self.folded(node, consts, where)

    def folded(self, node: Any, consts: dict[str, Any], where: str) -> None:
        """Tensors the graph computes from its constants, which inference and folding materialize."""
        op, ins = node.op_type, list(node.input)

        def value(i: int) -> list[float] | None:
            if i >= len(ins) or ins[i] not in consts:
                return None
            t = consts[ins[i]]
            if math.prod(int(d) for d in t.dims) > 64:
                return None
            from onnx import numpy_helper

            try:
                return [float(x) for x in numpy_helper.to_array(t).reshape(-1)]
            except (ValueError, TypeError):
                return None

        if op == "ConstantOfShape":
            shape = value(0)
            if shape is not None:
                self.count([int(x) for x in shape], 8, where, MAX_FOLDED_BYTES)
        elif op == "Expand":
            shape = value(1)
            if shape is not None:
                self.count([max(int(x), 1) for x in shape], 8, where, MAX_FOLDED_BYTES)
        elif op == "Tile":
            reps = value(1)
            if reps is not None:
                base = math.prod(int(d) for d in consts[ins[0]].dims) if ins[0] in consts else 1
                self.count([base, *(max(int(x), 0) for x in reps)], 8, where, MAX_FOLDED_BYTES)
        elif op == "Range":
            vals = [value(i) for i in range(3)]
            if all(v is not None and len(v) == 1 for v in vals):
                start, limit, delta = (v[0] for v in vals if v is not None)
                if delta == 0 or not all(math.isfinite(x) for x in (start, limit, delta)):
                    raise self.fail(where, "Range with a zero or non-finite step")
                self.count([max(0, math.ceil((limit - start) / delta))], 8, where, MAX_FOLDED_BYTES)
        elif op == "Loop":
            trips = value(0)
            if trips is None or len(trips) != 1 or not 0 <= trips[0] <= MAX_LOOP_TRIPS:
                self.check.unbounded.append(f"Loop {_safe(node.name or '?')!r}")
        elif op == "Scan" or op == "If" or op == "SequenceMap":
            pass  # bounded by their inputs


INFERENCE_MEMORY_BYTES = 1024**3  # address space shape inference may add (partition): it folds constants


@contextlib.contextmanager
def memory_limited(extra_bytes: int, what: str) -> Iterator[None]:
    """Run the body with ``RLIMIT_AS`` at what the process maps now plus ``extra_bytes`` (a safety
    net for tensors a graph computes in ways the static check cannot follow); running out is one
    ``InputError``. Where the limit cannot be set (not Linux, a lower hard limit) the body runs as is."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = vm_size() + extra_bytes
        if vm_size() == 0 or (hard != resource.RLIM_INFINITY and cap > hard):
            raise ValueError
        if soft != resource.RLIM_INFINITY and soft < cap:
            cap = soft
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):
        yield
        return
    try:
        yield
    except MemoryError:
        raise InputError(f"{what} needed more than {extra_bytes:,} bytes (the limit for it)") from None
    except InputError as exc:
        if "bad_alloc" in str(exc) or "MemoryError" in str(exc):
            raise InputError(f"{what} needed more than {extra_bytes:,} bytes (the limit for it)") from None
        raise
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def vm_size() -> int:
    """This process's virtual size (``VmSize``), 0 where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
