"""The feature cache's files (``runtime/featcache.py``'s L2): their names, what they hold, and how a
file is recognised as one the cache wrote.

An entry is ``mwfc-<BLAKE2b-160 of the fingerprint>.safetensors``: safetensors (never pickle) whose
header starts with ``{"__metadata__":{"checksum":"<40 hex>"``, the metadata holding the format, the
fingerprint, the kind (a tensor or a tuple), the count and ``created_s``. The checksum is a keyed
BLAKE2b-160 (the folder's secret key) of the file's length and all of its bytes, the checksum's own
40 characters read as zeros: ``verify`` checks it before parsing anything, so a file another
process truncated, extended, garbled or forged (without the key) is refused, never parsed or
returned. ``header_created_s`` reads only the header, for deciding whether a file may be deleted
(its name and header are the cache's) without reading every byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from typing import Any

import torch
from safetensors.torch import save as st_save

from memwarden.runtime.private_files import mac, mac_ok
from memwarden.untrusted import finite_float

__all__ = [
    "ENTRY_NAME",
    "FORMAT",
    "HEADER_READ_BYTES",
    "KEY_FILE",
    "PREFIX",
    "SUFFIX",
    "TEMP_NAME",
    "CorruptEntry",
    "created_s",
    "encode",
    "header_created_s",
    "stem_of",
    "verify",
]

FORMAT = "memwarden-featcache/2"
PREFIX, SUFFIX = "mwfc-", ".safetensors"
KEY_FILE = ".memwarden-featcache.key"
ENTRY_NAME = re.compile(r"mwfc-[0-9a-f]{40}\.safetensors")
TEMP_NAME = re.compile(r"\.[^/]+\.safetensors\.[0-9A-Za-z_]+\.partial")  # a writer's temp (private_files)
_LEAD = b'{"__metadata__":{"checksum":"'  # every header the cache writes starts so
_MAC_AT, _MAC_HEX = 8 + len(_LEAD), 40
_MAX_HEADER_BYTES = 1 << 16  # a few tensors' header is < 1 KiB; more is not ours
HEADER_READ_BYTES = 8 + _MAX_HEADER_BYTES


class CorruptEntry(Exception):
    """Not an entry this cache's key wrote, or not as written."""


def stem_of(fp: str) -> str:
    """File name stem for a fingerprint: its hash, so any string is a safe key (no path tricks)."""
    return hashlib.blake2b(fp.encode("utf-8", "surrogatepass"), digest_size=20).hexdigest()


def encode(fp: str, tensors: list[torch.Tensor], single: bool, now: float, *, key: bytes | None = None) -> bytes:
    """An entry's bytes, digest keyed with ``key`` (none: a random key, a file no cache accepts)."""
    # Clones: safetensors refuses tensors that share storage, and wants dense CPU memory.
    named = {str(i): t.detach().to("cpu", copy=True).contiguous() for i, t in enumerate(tensors)}
    data = st_save(named)
    (header_len,) = struct.unpack("<Q", data[:8])
    layout = json.loads(data[8 : 8 + header_len])
    layout.pop("__metadata__", None)
    meta = {"checksum": "0" * _MAC_HEX, "format": FORMAT, "fingerprint": fp, "kind": "tensor" if single else "tuple"}
    meta.update(count=str(len(tensors)), created_s=repr(float(now)))
    text = json.dumps({"__metadata__": meta, **layout}, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads its header to 8 bytes with spaces
    out = struct.pack("<Q", len(text)) + text + data[8 + header_len :]
    digest = _digest(out, os.urandom(32) if key is None else key)
    return out[:_MAC_AT] + digest + out[_MAC_AT + _MAC_HEX :]


def _digest(data: bytes, key: bytes) -> bytes:
    view, zeros, length = memoryview(data), b"0" * _MAC_HEX, len(data).to_bytes(8, "little")
    return mac(key, length, view[:_MAC_AT], zeros, view[_MAC_AT + _MAC_HEX :], digest_size=20).hex().encode()


def verify(data: bytes, key: bytes) -> dict[str, Any]:
    """The metadata of an entry ``key`` wrote, with its length and every byte as written; raises
    ``CorruptEntry`` otherwise. Nothing of the file is parsed before the digest matches."""
    if len(data) < _MAC_AT + _MAC_HEX or data[8:_MAC_AT] != _LEAD:
        raise CorruptEntry("not a memwarden feature-cache file")
    if not mac_ok(_digest(data, key), data[_MAC_AT : _MAC_AT + _MAC_HEX]):
        raise CorruptEntry("digest mismatch: changed, truncated or not written with this folder's key")
    (header_len,) = struct.unpack("<Q", data[:8])
    meta = json.loads(data[8 : 8 + header_len])["__metadata__"]
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CorruptEntry("another format")
    return meta


def created_s(meta: dict[str, Any]) -> float:
    """The entry's creation time: a finite number (``nan`` would never expire), else ``InputError``."""
    return finite_float(float(meta["created_s"]), "created_s", lo=0.0)


def header_created_s(head: bytes, stem: str) -> float | None:
    """The creation time in ``head`` (a file's first ``HEADER_READ_BYTES``) if it is the cache's
    header for the entry ``stem``; None otherwise. Never raises."""
    try:
        if len(head) < _MAC_AT or head[8:_MAC_AT] != _LEAD:
            return None
        (header_len,) = struct.unpack("<Q", head[:8])
        header = json.loads(head[8 : 8 + header_len]) if header_len <= len(head) - 8 else None
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("fingerprint"), str):
            return None
        return created_s(meta) if stem_of(meta["fingerprint"]) == stem else None
    except Exception:  # ValueError, RecursionError (deep JSON), InputError, KeyError, TypeError
        return None
