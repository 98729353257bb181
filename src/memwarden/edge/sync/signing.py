"""Publisher signatures on adapter manifests (Ed25519, via ``cryptography``).

The publisher signs each version's manifest when it publishes it (``AdapterStore(root,
signing_key=...)``); the manifest lists every tensor's BLAKE2b digest, so the signature covers
every byte of the adapter. A device pins the publisher's *public* key (``SyncClient(...,
publisher_key=...)``) and refuses a manifest that is unsigned or signed by any other key. The
sync server holds no key: it serves the signed manifests as they were published, and a delta
carries its target's signed manifest, so a compromised server or anyone on the (plain HTTP)
path can withhold updates but never forge one.

A signed manifest is the manifest's JSON with a ``signature`` object (``alg``, ``key_id``,
``sig``) added before its ``digest`` is computed: the digest (transit corruption: retried) covers
the signature, the signature (forgery: refused at once) covers all the rest.

Keys: a private key is a PKCS#8 PEM file written mode 0600 (``memwarden lora keygen``); a public
key is 64 hex digits, optionally prefixed ``ed25519:``, or a file holding that.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from memwarden.edge.sync.errors import SignatureError
from memwarden.edge.sync.manifest import MAX_HEADER_BYTES, AdapterFormatError, Manifest, load_json
from memwarden.errors import InputError
from memwarden.untrusted import read_regular

__all__ = ["PublicKey", "SigningKey", "sign_manifest", "verify_manifest"]

_DOMAIN = b"memwarden-lora-manifest-signature/1\n"
_HEX_KEY = re.compile(r"^(?:ed25519:)?([0-9a-fA-F]{64})$")
_HEX_SIG = re.compile(r"^[0-9a-f]{128}$")
_MAX_KEY_FILE = 16 << 10


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - an install without the sync extra
        raise InputError("adapter signatures need the 'cryptography' package: pip install 'memwarden[sync]'") from None
    return ed25519


class PublicKey:
    """A publisher's Ed25519 public key, as a device pins it."""

    def __init__(self, raw: bytes) -> None:
        if len(raw) != 32:
            raise InputError(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
        self.raw = bytes(raw)
        self._key = _crypto().Ed25519PublicKey.from_public_bytes(self.raw)

    @classmethod
    def parse(cls, value: PublicKey | str | bytes | os.PathLike[str]) -> PublicKey:
        """A key from 64 hex digits (``ed25519:`` prefix allowed), or a file holding them."""
        if isinstance(value, PublicKey):
            return value
        if isinstance(value, bytes) and len(value) == 32:
            return cls(value)
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else os.fspath(value)
        match = _HEX_KEY.match(text.strip())
        if match is None and len(text) < 4096 and Path(text).exists():
            raw = read_regular(text, _MAX_KEY_FILE, what="a publisher public key")
            match = _HEX_KEY.match(raw.decode("ascii", "replace").strip())
        if match is None:
            raise InputError("a publisher key is 64 hex digits (ed25519:...) or a file holding them")
        return cls(bytes.fromhex(match.group(1)))

    @property
    def key_id(self) -> str:
        return hashlib.blake2b(self.raw, digest_size=8).hexdigest()

    def text(self) -> str:
        return "ed25519:" + self.raw.hex()

    def verify(self, signature: bytes, payload: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            self._key.verify(signature, payload)
        except InvalidSignature:
            return False
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKey) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)


class SigningKey:
    """The publisher's Ed25519 private key."""

    def __init__(self, key: Any) -> None:
        self._key = key

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(_crypto().Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        from cryptography.hazmat.primitives import serialization

        pem = read_regular(path, _MAX_KEY_FILE, what="a signing key (PEM)")
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError):
            raise InputError(f"{path}: not an unencrypted PEM private key") from None
        if not isinstance(key, _crypto().Ed25519PrivateKey):
            raise InputError(f"{path}: not an Ed25519 key")
        return cls(key)

    def pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return bytes(
            self._key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key to a new file, readable by its owner only (never over an existing file)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.pem())

    @property
    def public_key(self) -> PublicKey:
        from cryptography.hazmat.primitives import serialization

        return PublicKey(
            self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        )

    def sign(self, payload: bytes) -> bytes:
        return bytes(self._key.sign(payload))


def _payload(doc: dict[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k not in ("digest", "signature")}
    return _DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign_manifest(manifest: Manifest, key: SigningKey) -> bytes:
    """The manifest's JSON bytes with the publisher's signature (and a digest over both)."""
    doc = manifest.to_json()
    doc.pop("digest")
    public = key.public_key
    doc["signature"] = {"alg": "ed25519", "key_id": public.key_id, "sig": key.sign(_payload(doc)).hex()}
    return manifest.with_doc(doc)


def verify_manifest(data: bytes, key: PublicKey, *, max_bytes: int = MAX_HEADER_BYTES) -> Manifest:
    """The manifest in ``data`` if ``key`` signed it. ``AdapterFormatError`` for a malformed or
    corrupted body (a digest that fails: worth fetching again), ``SignatureError`` for a whole
    body that is unsigned or signed by another key (forged: refused)."""
    if len(data) > max_bytes:
        raise AdapterFormatError(f"manifest over {max_bytes} bytes")
    doc = load_json(data, "manifest")
    manifest = Manifest.from_json(doc)  # digests first: a corrupted body is not a forgery
    check_signature(doc, key, f"{manifest.adapter} v{manifest.version}")
    return manifest


def check_signature(doc: Any, key: PublicKey, what: str) -> None:
    sig = doc.get("signature") if isinstance(doc, dict) else None
    if not isinstance(sig, dict):
        raise SignatureError(f"the manifest of {what} is not signed: refused (publisher key {key.key_id})")
    if sig.get("alg") != "ed25519" or not isinstance(sig.get("sig"), str) or not _HEX_SIG.match(sig["sig"]):
        raise SignatureError(f"the manifest of {what} has a malformed signature: refused")
    if not key.verify(bytes.fromhex(sig["sig"]), _payload(doc)):
        other = sig.get("key_id")
        by = f"key {str(other)[:16]}" if isinstance(other, str) and other != key.key_id else "another key"
        raise SignatureError(
            f"the manifest of {what} is not signed by the pinned publisher key {key.key_id} (signed by {by}): refused"
        )
