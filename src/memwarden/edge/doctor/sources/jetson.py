"""NVIDIA Jetson: the L4T release from ``/etc/nv_tegra_release`` ("# R35 (release), REVISION: 4.1")."""

from __future__ import annotations

import re
from typing import Any

from memwarden.edge.doctor.sources._read import read_text

_RELEASE = re.compile(r"R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)")


def collect() -> dict[str, Any]:
    raw = read_text("/etc/nv_tegra_release")
    if raw is None:
        return {"status": "not present"}
    match = _RELEASE.search(raw)
    if not match:
        return {"status": "present", "l4t": None, "raw": raw.strip()[:200]}
    return {"status": "present", "l4t": f"{match.group(1)}.{match.group(2)}"}
