"""memwarden lora manifest|diff|apply: versioned LoRA adapter manifests and per-tensor deltas.

    memwarden lora keygen -o KEY
    memwarden lora manifest ADAPTER [--version N] [--previous MANIFEST] [--sign-key KEY] [-o MANIFEST]
    memwarden lora diff OLD NEW -o DELTA [--old-version N] [--version N] [--sign-key KEY]
    memwarden lora apply BASE DELTA -o NEW [--publisher-key PUB]

ADAPTER, OLD, NEW and BASE are safetensors adapter files (or PEFT adapter folders holding
``adapter_model.safetensors``); OLD may also be a manifest (what a device reports it holds).
``apply`` on a PEFT folder writes a PEFT folder (the new weights and the base's
``adapter_config.json``); an output ending in ``/``, or an existing folder, is a folder too.
``keygen`` makes the publisher's Ed25519 key (KEY, mode 0600) and prints the public key that
devices pin (``SyncClient(publisher_key=...)``, ``apply --publisher-key``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.untrusted import read_regular

_PEFT_FILE = "adapter_model.safetensors"
_PEFT_CONFIG = "adapter_config.json"


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
    m.add_argument("--sign-key", metavar="KEY", help="sign the manifest with the publisher's key (lora keygen)")
    m.add_argument("-o", "--output", metavar="MANIFEST", help="write the manifest here (default: print it)")
    m.set_defaults(func=run_manifest)

    k = lsub.add_parser("keygen", help="make a publisher's Ed25519 signing key; print the public key devices pin")
    k.add_argument("-o", "--output", metavar="KEY", required=True, help="the private key file to create (mode 0600)")
    k.set_defaults(func=run_keygen)

    d = lsub.add_parser("diff", help="a delta from OLD to NEW holding only the changed tensors")
    d.add_argument("old", metavar="OLD", help="old adapter (file, PEFT folder) or its manifest")
    d.add_argument("new", metavar="NEW", help="new adapter (file or PEFT folder)")
    d.add_argument("-o", "--output", metavar="DELTA", required=True, help="write the delta (.safetensors) here")
    d.add_argument("--name", help="adapter name (default: OLD's)")
    d.add_argument("--old-version", type=int, help="OLD's version when it is an adapter file without one (default 0)")
    d.add_argument("--version", type=int, help="NEW's version (default: NEW's metadata, else OLD's + 1)")
    d.add_argument("--sign-key", metavar="KEY", help="sign the delta's manifest with the publisher's key")
    d.set_defaults(func=run_diff)

    a = lsub.add_parser("apply", help="rebuild the new adapter file from BASE and a DELTA, every digest checked")
    a.add_argument("base", metavar="BASE", help="the adapter the delta applies to (file or PEFT folder)")
    a.add_argument("delta", metavar="DELTA", help="the delta file")
    a.add_argument(
        "-o",
        "--output",
        metavar="NEW",
        required=True,
        help="write the new adapter here (a PEFT folder when BASE is one, or NEW ends in '/')",
    )
    a.add_argument("--publisher-key", metavar="PUB", help="refuse a delta not signed by this public key")
    a.set_defaults(func=run_apply)


_MAX_ADAPTER_BYTES = 16 << 30  # a rank-64 adapter of a 70B model is ~1.7 GB; a delta or manifest less
_MAX_CONFIG_BYTES = 1 << 20


def _read(path: str) -> bytes:
    """A regular file's bytes (or a PEFT folder's adapter file): a device (/dev/zero), FIFO or socket is
    refused without blocking (``untrusted.read_regular``); so is a file past the cap."""
    p = Path(path)
    if p.is_dir():
        p = p / _PEFT_FILE
        if not p.is_file():
            raise InputError(f"{path}: a folder without {_PEFT_FILE}")
    try:
        return read_regular(p, _MAX_ADAPTER_BYTES, what="an adapter, delta or manifest file")
    except MemoryError:
        raise InputError(f"{path}: the file does not fit in this process's memory") from None


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
    doc = manifest.to_json()
    if args.sign_key:
        from memwarden.edge.sync.signing import SigningKey, sign_manifest

        doc = json.loads(sign_manifest(manifest, SigningKey.load(args.sign_key)))
    if not args.output:
        print_json(doc)
        return 0
    atomic_write(args.output, json.dumps(doc, indent=1).encode() + b"\n")
    wrote(args.output, f"{len(manifest.tensors)} tensors, {len(manifest.layers)} layers, v{manifest.version}")
    return 0


def run_diff(args: argparse.Namespace) -> int:
    from memwarden.commands._common import wrote
    from memwarden.edge.sync.delta import make_delta
    from memwarden.trace.io import atomic_write
    from memwarden.units import format_bytes

    old = _old_manifest(args.old, args.name, args.old_version)
    new_blob = _read(args.new)
    signed = None
    if args.sign_key:
        from memwarden.edge.sync.delta import adapter_manifest
        from memwarden.edge.sync.signing import SigningKey, sign_manifest

        key = SigningKey.load(args.sign_key)
        target = old.version + 1 if args.version is None else args.version
        new, _ = adapter_manifest(new_blob, adapter=old.adapter, version=target, previous=old)
        signed = sign_manifest(new, key)
    blob, delta = make_delta(old, new_blob, version=args.version, signed_manifest=signed)
    atomic_write(args.output, blob)
    total = delta.manifest.nbytes
    wrote(
        args.output,
        f"v{old.version} -> v{delta.manifest.version}: {len(delta.tensors)} of {len(delta.manifest.tensors)} tensors "
        f"changed in {len(delta.changed_layers)} of {len(delta.manifest.layers)} layers; "
        f"{format_bytes(len(blob))} for {format_bytes(total)} of adapter",
    )
    return 0


def run_keygen(args: argparse.Namespace) -> int:
    from memwarden.commands._common import wrote
    from memwarden.edge.sync.signing import SigningKey

    out = Path(args.output)
    pub = out.with_name(out.name + ".pub")
    for path in (out, pub):
        if path.exists() or path.is_symlink():
            raise InputError(f"{path}: exists already; a key is never overwritten")
    key = SigningKey.generate()
    key.save(out)
    pub.write_text(key.public_key.text() + "\n")
    wrote(out, f"private, mode 0600; public key {key.public_key.text()} in {pub.name}")
    return 0


def run_apply(args: argparse.Namespace) -> int:
    from memwarden.commands._common import wrote
    from memwarden.edge.sync.delta import apply_to_adapter
    from memwarden.trace.io import atomic_write

    key = None
    if args.publisher_key:
        from memwarden.edge.sync.signing import PublicKey

        key = PublicKey.parse(args.publisher_key)
    base_folder = Path(args.base).is_dir()
    out = Path(args.output)
    to_folder = base_folder or args.output.endswith(("/", os.sep)) or out.is_dir()
    if to_folder and out.exists() and not out.is_dir():
        raise InputError(f"-o {args.output}: a file; {'a PEFT base' if base_folder else 'a trailing /'} means a folder")
    config = _peft_config(Path(args.base)) if base_folder else None
    blob, manifest = apply_to_adapter(_read(args.base), _read(args.delta), publisher_key=key)
    detail = f"{manifest.adapter} v{manifest.version}, {len(manifest.tensors)} tensors verified"
    if not to_folder:
        atomic_write(args.output, blob)
        wrote(args.output, detail)
        return 0
    files = {_PEFT_FILE: blob, **({_PEFT_CONFIG: config} if config is not None else {})}
    _write_folder(out, files)
    kind = "a PEFT adapter folder" if config is not None else f"{_PEFT_FILE} only (the base has no {_PEFT_CONFIG})"
    wrote(str(out).rstrip("/") + "/", f"{detail}; {kind}")
    return 0


def _peft_config(folder: Path) -> bytes | None:
    """The base folder's ``adapter_config.json`` (a JSON object), which the new folder needs for
    PEFT to load it; None when the base has none."""
    from memwarden.edge.sync.manifest import load_json

    path = folder / _PEFT_CONFIG
    if not path.exists():
        return None
    data = read_regular(path, _MAX_CONFIG_BYTES, what="a PEFT adapter_config.json")
    if not isinstance(load_json(data, f"{path}"), dict):
        raise InputError(f"{path}: not a JSON object")
    return data


def _write_folder(out: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into folder ``out``: a new folder appears whole (built beside it, then
    renamed into place); in an existing one each file is replaced atomically."""
    from memwarden.trace.io import atomic_write

    if out.is_dir():
        for name, data in files.items():
            atomic_write(out / name, data)
        return
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"-o {out}: folder {parent} does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        os.chmod(tmp, 0o777 & ~_umask())
        os.rename(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"-o {out}: cannot write the folder ({exc.strerror or type(exc).__name__})") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
