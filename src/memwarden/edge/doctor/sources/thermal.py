"""Thermal zones from sysfs: temperature and trip points (millidegrees Celsius in the files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memwarden.edge.doctor.sources._read import read_int, read_text


def collect(root: str = "/sys/class/thermal") -> dict[str, Any]:
    base = Path(root)
    try:
        zones_dirs = sorted(base.glob("thermal_zone*"))
    except OSError:
        zones_dirs = []
    if not zones_dirs:
        return {"status": "not present", "zones": []}
    zones = []
    for zone in zones_dirs:
        milli_c = read_int(zone / "temp")
        trips = []
        for i in range(16):
            kind = read_text(zone / f"trip_point_{i}_type", 64)
            trip_milli_c = read_int(zone / f"trip_point_{i}_temp")
            if kind is None or trip_milli_c is None:
                break
            trips.append({"type": kind.strip(), "temp_c": trip_milli_c / 1000})
        zones.append(
            {
                "name": zone.name,
                "type": (read_text(zone / "type", 128) or "").strip() or None,
                "temp_c": None if milli_c is None else milli_c / 1000,
                "trips": trips,
            }
        )
    return {"status": "present", "zones": zones}
