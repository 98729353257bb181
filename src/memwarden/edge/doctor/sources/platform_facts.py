"""Python, OS, CPU architecture and, on boards, the SoC and model from the device tree."""

from __future__ import annotations

import platform
import sys
from typing import Any

from memwarden.edge.doctor.sources._read import read_text


def collect() -> dict[str, Any]:
    model = read_text("/proc/device-tree/model")
    compatible = read_text("/proc/device-tree/compatible")
    soc = read_text("/sys/devices/soc0/machine") or (
        compatible.split("\x00")[-2] if compatible and "\x00" in compatible else None
    )
    return {
        "status": "present",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "model": model.strip("\x00\n ") if model else None,
        "soc": soc.strip("\x00\n ") if soc else None,
        "os_version": None,  # phones: filled in by a facts file from the device
    }
