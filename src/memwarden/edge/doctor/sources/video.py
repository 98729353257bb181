"""Video capture devices (V4L2) by name. Their frame rate needs the device opened, which the
doctor does not do; a facts file from a board can carry ``fps`` per device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memwarden.edge.doctor.sources._read import read_text


def collect(root: str = "/sys/class/video4linux") -> dict[str, Any]:
    try:
        nodes = sorted(Path(root).glob("video*"))
    except OSError:
        nodes = []
    if not nodes:
        return {"status": "not present", "devices": []}
    devices = [{"id": f"/dev/{n.name}", "name": (read_text(n / "name", 256) or "").strip() or None} for n in nodes]
    return {"status": "present", "devices": devices}
