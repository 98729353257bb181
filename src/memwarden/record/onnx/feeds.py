"""Feeds for an ONNX model: the ``.npz`` given as ``--inputs``, read as untrusted data.

An ``.npz`` is a zip of ``.npy`` members, and a 1 MB zip can inflate to gigabytes. So the
members' ``.npy`` headers (dtype and shape) are read first, without inflating any data, and the
declared sizes are checked (each array a plain numeric dtype, no pickled objects, at most
``MAX_FEED_BYTES`` in all, the zip's stated size of each member consistent with its header)
before any array is loaded; ``partition`` needs only the headers and never loads the data. Given
the model's inputs (``load_feeds(path, inputs=graph.input_specs)``), the headers are also checked
against them (names, dtypes, ranks, fixed axes) before anything is inflated, so a member the model
cannot take costs its header, not its data. The file must be a regular file (a FIFO is refused,
not waited on) of at most ``MAX_FEED_FILE_BYTES``.

``save_feeds`` writes feeds under any names (``np.savez(path, **feeds)`` fails for an input
named ``file`` or ``allow_pickle``).
"""

from __future__ import annotations

import io
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from memwarden.errors import InputError
from memwarden.record.onnx.guard import check_regular
from memwarden.untrusted import terminal_safe

__all__ = [
    "MAX_FEED_BYTES",
    "MAX_FEED_FILE_BYTES",
    "MAX_FEEDS",
    "InputSpec",
    "check_feed_shapes",
    "feed_headers",
    "load_feeds",
    "save_feeds",
]

MAX_FEED_BYTES = 256 * 1024**2  # the arrays of one --inputs file, as declared, in all
MAX_FEED_FILE_BYTES = MAX_FEED_BYTES + 64 * 1024**2
MAX_FEEDS = 4096  # arrays in one file
_MAX_HEADER = 1 << 16  # numpy's own headers are a few hundred bytes

Header = tuple[np.dtype, tuple[int, ...]]
# a model input as ``GraphInfo.input_specs`` gives it: (ONNX element type, 0 for unknown; dims, an
# int for a fixed axis, a symbol or None for a free one; None for an unknown rank)
InputSpec = tuple[int, tuple[int | str | None, ...] | None]


def _name(path: str | Path) -> str:
    return terminal_safe(str(path))[:200]


def _open_zip(path: str | Path) -> zipfile.ZipFile:
    check_regular(path, "an .npz of input arrays (one per model input)", MAX_FEED_FILE_BYTES)
    try:
        with open(path, "rb") as fp:  # the directory's size, before zipfile reads every entry of it
            end = zipfile._EndRecData(fp)  # type: ignore[attr-defined]
        if end is not None and (
            end[zipfile._ECD_ENTRIES_TOTAL] > MAX_FEEDS or end[zipfile._ECD_SIZE] > MAX_FEEDS * 4096  # type: ignore[attr-defined]
        ):
            raise InputError(f"{_name(path)}: a zip directory of more than {MAX_FEEDS} feeds")
        return zipfile.ZipFile(Path(path))
    # NotImplementedError: a directory entry asking for a zip version past Python's (a damaged byte)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic == b"\x93NUMPY":
            raise InputError(
                f"{_name(path)}: a single .npy array; --inputs takes an .npz with one array per model input "
                "(np.savez('feeds.npz', input_ids=...))"
            ) from None
        raise InputError(f"{_name(path)}: not an .npz of input arrays ({terminal_safe(exc)[:200]})") from None


def _member_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: str | Path) -> Header:
    label = f"{_name(path)}: array {terminal_safe(info.filename[:-4])[:80]!r}"
    try:
        with zf.open(info) as f:
            head = f.read(_MAX_HEADER + 16)
        stream = io.BytesIO(head)
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream, max_header_size=_MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream, max_header_size=_MAX_HEADER)
        else:
            raise ValueError(f"npy version {version}")
        data_start = stream.tell()
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError, SyntaxError, TypeError, zlib.error) as exc:
        raise InputError(f"{label}: not a readable .npy ({terminal_safe(exc)[:160]})") from None
    except NotImplementedError as exc:  # an encrypted or unsupported compression
        raise InputError(f"{label}: {terminal_safe(exc)[:160]}") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise InputError(f"{label}: holds Python objects or records ({terminal_safe(dtype)[:60]}); give numeric arrays")
    if dtype.kind not in "biufc" or dtype.itemsize == 0:
        raise InputError(f"{label}: dtype {terminal_safe(dtype)[:40]} is not a numeric type")
    count = 1
    for d in shape:
        if not isinstance(d, int) or d < 0:
            raise InputError(f"{label}: shape {terminal_safe(shape)[:80]} is not an array shape")
        count *= d
        if count > MAX_FEED_BYTES:
            break
    nbytes = count * dtype.itemsize
    if nbytes > MAX_FEED_BYTES:
        raise InputError(f"{label}: declares {nbytes:,} bytes, over the {MAX_FEED_BYTES:,}-byte limit for feeds")
    if info.file_size != data_start + nbytes:
        raise InputError(
            f"{label}: the zip says {info.file_size} bytes, its header {data_start + nbytes} (shape "
            f"{tuple(shape)}, {dtype}): a damaged or crafted file"
        )
    return dtype, tuple(int(d) for d in shape)


def _headers(zf: zipfile.ZipFile, path: str | Path) -> dict[str, tuple[zipfile.ZipInfo, Header]]:
    members = zf.infolist()
    if len(members) > MAX_FEEDS:
        raise InputError(f"{_name(path)}: {len(members)} members, over the limit of {MAX_FEEDS} feeds")
    out: dict[str, tuple[zipfile.ZipInfo, Header]] = {}
    total = 0
    for info in members:
        if not info.filename.endswith(".npy"):
            raise InputError(f"{_name(path)}: member {terminal_safe(info.filename)[:80]!r} is not an .npy array")
        name = info.filename[:-4]
        if name in out:
            raise InputError(f"{_name(path)}: array {terminal_safe(name)[:80]!r} is stored twice")
        header = _member_header(zf, info, path)
        total += info.file_size
        if total > MAX_FEED_BYTES + 4096 * len(members):
            raise InputError(f"{_name(path)}: the arrays declare more than the {MAX_FEED_BYTES:,}-byte limit for feeds")
        out[name] = (info, header)
    if not out:
        raise InputError(f"{_name(path)}: holds no arrays")
    return out


def feed_headers(path: str | Path) -> dict[str, Header]:
    """name -> (dtype, shape) of every array of the ``.npz`` at ``path``; no data is inflated."""
    with _open_zip(path) as zf:
        return {name: header for name, (_, header) in _headers(zf, path).items()}


def _onnx_dtype(elem_type: int) -> np.dtype | None:
    """The numpy dtype of an ONNX element type; None where numpy has none (bfloat16, float8)."""
    if elem_type <= 0:
        return None
    from onnx import helper

    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None
    return dtype if dtype.kind in "biufc" else None


def check_feed_shapes(
    headers: Mapping[str, Header], inputs: Mapping[str, InputSpec], path: str | Path, *, all_inputs: bool = True
) -> None:
    """``InputError`` (one line) unless every array of ``headers`` is a model input of its dtype,
    rank and fixed axes; with ``all_inputs``, every input must have its array (what a run needs)."""
    missing = sorted(set(inputs) - set(headers)) if all_inputs else []
    extra = sorted(set(headers) - set(inputs))
    if missing or extra:
        raise InputError(
            terminal_safe(
                f"{_name(path)}: the arrays do not match the model's inputs: missing {missing[:20] or 'none'}, "
                f"unexpected {extra[:20] or 'none'} (model inputs: {', '.join(list(inputs)[:20])})"
            )[:600]
        )
    for name, (dtype, shape) in headers.items():
        elem_type, dims = inputs[name]
        label = f"{_name(path)}: array {terminal_safe(name)[:80]!r}"
        wanted = _onnx_dtype(elem_type)
        if wanted is not None and (wanted.kind, wanted.itemsize) != (dtype.kind, dtype.itemsize):  # any byte order
            raise InputError(f"{label} is {dtype}; the model's input is {wanted}")
        if dims is not None and (
            len(dims) != len(shape) or any(isinstance(d, int) and d != n for d, n in zip(dims, shape, strict=True))
        ):
            want = tuple(d if d is not None else "?" for d in dims)
            raise InputError(terminal_safe(f"{label} has shape {shape}; the model's input is {want}")[:400])


def load_feeds(path: str | Path, *, inputs: Mapping[str, InputSpec] | None = None) -> dict[str, np.ndarray]:
    """Feeds from an ``.npz`` (one array per model input), headers checked before any data is read:
    against the size limits, and with ``inputs`` (``GraphInfo.input_specs``) against the model."""
    with _open_zip(path) as zf:
        headers = _headers(zf, path)
        if inputs is not None:
            check_feed_shapes({name: header for name, (_, header) in headers.items()}, inputs, path)
        out = {}
        for name, (info, (dtype, shape)) in headers.items():
            try:
                with zf.open(info) as f:
                    array = np.lib.format.read_array(f, allow_pickle=False)
            except (
                ValueError,
                OSError,
                EOFError,
                zipfile.BadZipFile,
                RuntimeError,
                zlib.error,
                NotImplementedError,
            ) as exc:
                raise InputError(
                    f"{_name(path)}: array {terminal_safe(name)[:80]!r} cannot be read ({terminal_safe(exc)[:160]})"
                ) from None
            if array.dtype != dtype or array.shape != shape:
                raise InputError(f"{_name(path)}: array {terminal_safe(name)[:80]!r} does not match its header")
            out[name] = array
        return out


def save_feeds(path: str | Path, feeds: Mapping[str, np.ndarray]) -> None:
    """Write ``feeds`` as an ``.npz`` that ``np.load`` and ``load_feeds`` read back, under any names."""
    with zipfile.ZipFile(Path(path), "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, array in feeds.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)
