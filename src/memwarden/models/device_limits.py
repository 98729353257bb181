"""The limit that kills an app, in a device profile: iOS jetsam's per-app memory limit (and the
one the increased-memory-limit entitlement raises it to), Android lmkd's kill threshold, the share
of a Jetson's unified memory that CUDA can allocate. Each built-in figure is cited or marked as an
assumption in its TOML file."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memwarden.errors import InputError

__all__ = ["ENTITLED", "LIMIT_KINDS", "KillLimit", "entitled_profile"]

LIMIT_KINDS = ("ios-jetsam", "android-lmkd", "jetson-gpu-share")
ENTITLED = ":entitled"  # load_profile("iphone-15-pro:entitled"): the increased-memory-limit entitlement


@dataclass(frozen=True, kw_only=True)
class KillLimit:
    """What the OS lets one app hold before it kills it (iOS jetsam's per-app limit, Android lmkd's
    kill threshold, the share of a Jetson's unified memory CUDA can allocate), in bytes."""

    kind: str  # one of LIMIT_KINDS
    app_bytes: int
    entitled_bytes: int | None = None  # iOS with com.apple.developer.kernel.increased-memory-limit
    source: str  # a citation, or "assumption: ..."
    entitled: bool = False  # this profile plans with entitled_bytes

    @property
    def bytes(self) -> int:
        return self.entitled_bytes if self.entitled and self.entitled_bytes is not None else self.app_bytes

    def describe(self) -> str:
        what = {
            "ios-jetsam": "iOS per-app memory limit (jetsam)",
            "android-lmkd": "Android low-memory-killer threshold",
            "jetson-gpu-share": "GPU share of the Jetson's unified memory",
        }[self.kind]
        if self.kind == "ios-jetsam":
            what += ", with the increased-memory-limit entitlement" if self.entitled else ", without entitlements"
        return what

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "bytes": self.bytes,
            "app_bytes": self.app_bytes,
            "entitled_bytes": self.entitled_bytes,
            "entitled": self.entitled,
            "source": self.source,
        }


def entitled_profile(profile: Any) -> Any:
    """The DeviceProfile of an app holding iOS's increased-memory-limit entitlement."""
    limit = profile.limit
    if limit is None or limit.entitled_bytes is None:
        raise InputError(f"{profile.id} has no entitled memory limit (only iOS profiles with limit.entitled_bytes)")
    return replace(
        profile,
        id=f"{profile.id}-entitled",
        name=f"{profile.name}, increased-memory-limit entitlement",
        limit=replace(limit, entitled=True),
    )
