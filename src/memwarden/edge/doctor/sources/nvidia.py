"""The NVIDIA driver: version and the newest CUDA it supports, through NVML.

``/proc/driver/nvidia/version`` first (no library to load); NVML (``pynvml``, from
nvidia-ml-py) adds the CUDA driver version and the GPUs. No driver is a fact, not an error.
"""

from __future__ import annotations

import re
from typing import Any

from memwarden.edge.doctor.sources._read import read_text

_PROC = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9]+\.[0-9.]+)")


def collect() -> dict[str, Any]:
    facts: dict[str, Any] = {"status": "not present"}
    proc = read_text("/proc/driver/nvidia/version")
    if proc and (match := _PROC.search(proc)):
        facts = {"status": "present", "driver": match.group(1)}
    try:
        import pynvml
    except ImportError:
        return facts | {"nvml": "not present"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no usable driver here
        return facts | {"nvml": f"not present ({type(exc).__name__})"}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()  # 12040 -> "12.4"
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append({"name": name if isinstance(name, str) else name.decode(), "memory_bytes": int(memory.total)})
        return {
            "status": "present",
            "driver": driver if isinstance(driver, str) else driver.decode(),
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "gpus": gpus,
            "nvml": "present",
        }
    except Exception as exc:
        return facts | {"nvml": f"error ({type(exc).__name__}: {exc})"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
