"""memwarden lora manifest|diff|apply: versioned LoRA adapter manifests and per-tensor deltas.

    memwarden lora manifest ADAPTER [--version N] [--previous MANIFEST] [-o MANIFEST]
    memwarden lora diff OLD NEW -o DELTA [--old-version N] [--version N]
    memwarden lora apply BASE DELTA -o NEW

ADAPTER, OLD, NEW and BASE are safetensors adapter files (or PEFT adapter folders holding
``adapter_model.safetensors``); OLD may also be a manifest (what a device reports it holds).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from memwarden.errors import InputError

_PEFT_FILE = "adapter_model.safetensors"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "lora",
        help="versioned LoRA adapter manifests and deltas that ship only the changed tensors",
        description=(
            "Describe a LoRA adapter tensor by tensor (name, shape, dtype, BLAKE2b digest, rank, version), make a "
            "delta holding only the tensors that changed between two versions, and rebuild the new adapter from "
            "the old one and a delta. A device applies deltas in place (memwarden.runtime.lora) or pulls them from "
            "a sync server (memwarden.edge.sync)."
        ),
    )
    lsub = p.add_subparsers(dest="lora_command", metavar="SUBCOMMAND", required=True)

    m = lsub.add_parser("manifest", help="print or write an adapter's manifest (JSON)")
    m.add_argument("adapter", metavar="ADAPTER", help="adapter .safetensors file or PEFT adapter folder")
    m.add_argument("--name", help="adapter name (default: the file's metadata, else 'adapter')")
    m.add_argument("--version", type=int, help="version (default: the file's metadata, else previous + 1, else 0)")
    m.add_argument(
        "--previous", metavar="MANIFEST", help="the previous version's manifest: unchanged tensors keep its versions"
    )
    m.add_argument("-o", "--output", metavar="MANIFEST", help="write the manifest here (default: print it)")
    m.set_defaults(func=run_manifest)

    d = lsub.add_parser("diff", help="a delta from OLD to NEW holding only the changed tensors")
    d.add_argument("old", metavar="OLD", help="old adapter (file, PEFT folder) or its manifest")
    d.add_argument("new", metavar="NEW", help="new adapter (file or PEFT folder)")
    d.add_argument("-o", "--output", metavar="DELTA", required=True, help="write the delta (.safetensors) here")
    d.add_argument("--name", help="adapter name (default: OLD's)")
    d.add_argument("--old-version", type=int, help="OLD's version when it is an adapter file without one (default 0)")
    d.add_argument("--version", type=int, help="NEW's version (default: NEW's metadata, else OLD's + 1)")
    d.set_defaults(func=run_diff)

    a = lsub.add_parser("apply", help="rebuild the new adapter file from BASE and a DELTA, every digest checked")
    a.add_argument("base", metavar="BASE", help="the adapter the delta applies to (file or PEFT folder)")
    a.add_argument("delta", metavar="DELTA", help="the delta file")
    a.add_argument("-o", "--output", metavar="NEW", required=True, help="write the new adapter here")
    a.set_defaults(func=run_apply)


_MAX_ADAPTER_BYTES = 16 << 30  # a rank-64 adapter of a 70B model is ~1.7 GB; a delta or manifest less


def _read(path: str) -> bytes:
    """A regular file's bytes (or a PEFT folder's adapter file): a device (/dev/zero), FIFO or socket is
    refused before it is opened, since reading one never ends or blocks; so is a file past the cap."""
    p = Path(path)
    if p.is_dir():
        p = p / _PEFT_FILE
        if not p.is_file():
            raise InputError(f"{path}: a folder without {_PEFT_FILE}")
    if p.exists() and not p.is_file():
        raise InputError(f"{path}: not a regular file (a device, FIFO or socket); expected an adapter file")
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    if size > _MAX_ADAPTER_BYTES:
        raise InputError(f"{path}: {size} bytes is larger than any adapter (limit {_MAX_ADAPTER_BYTES})")
    try:
        return p.read_bytes()
    except MemoryError:
        raise InputError(f"{path}: {size} bytes do not fit in this process's memory") from None


def _old_manifest(path: str, name: str | None, version: int | None) -> Any:
    from memwarden.edge.sync.delta import adapter_manifest
    from memwarden.edge.sync.manifest import Manifest

    data = _read(path)
    if data[:1] == b"{" and data.rstrip()[-1:] == b"}":
        try:
            return Manifest.from_bytes(data)
        except InputError:
            pass  # a safetensors file whose header length starts with '{': read it as one
    return adapter_manifest(data, adapter=name, version=version if version is not None else None)[0]


def run_manifest(args: argparse.Namespace) -> int:
    from memwarden.commands._common import print_json, wrote
    from memwarden.edge.sync.delta import adapter_manifest
    from memwarden.edge.sync.manifest import Manifest
    from memwarden.trace.io import atomic_write

    previous = Manifest.from_bytes(_read(args.previous)) if args.previous else None
    manifest, _ = adapter_manifest(_read(args.adapter), adapter=args.name, version=args.version, previous=previous)
    if not args.output:
        print_json(manifest.to_json())
        return 0
    atomic_write(args.output, json.dumps(manifest.to_json(), indent=1).encode() + b"\n")
    wrote(args.output, f"{len(manifest.tensors)} tensors, {len(manifest.layers)} layers, v{manifest.version}")
    return 0


def run_diff(args: argparse.Namespace) -> int:
    from memwarden.commands._common import wrote
    from memwarden.edge.sync.delta import make_delta
    from memwarden.trace.io import atomic_write
    from memwarden.units import format_bytes

    old = _old_manifest(args.old, args.name, args.old_version)
    blob, delta = make_delta(old, _read(args.new), version=args.version)
    atomic_write(args.output, blob)
    total = delta.manifest.nbytes
    wrote(
        args.output,
        f"v{old.version} -> v{delta.manifest.version}: {len(delta.tensors)} of {len(delta.manifest.tensors)} tensors "
        f"changed in {len(delta.changed_layers)} of {len(delta.manifest.layers)} layers; "
        f"{format_bytes(len(blob))} for {format_bytes(total)} of adapter",
    )
    return 0


def run_apply(args: argparse.Namespace) -> int:
    from memwarden.commands._common import wrote
    from memwarden.edge.sync.delta import apply_to_adapter
    from memwarden.trace.io import atomic_write

    blob, manifest = apply_to_adapter(_read(args.base), _read(args.delta))
    atomic_write(args.output, blob)
    wrote(args.output, f"{manifest.adapter} v{manifest.version}, {len(manifest.tensors)} tensors verified")
    return 0
