"""Derived facts: comparisons across sources that the known-issue data refers to by name."""

from __future__ import annotations

from typing import Any

from memwarden.edge.doctor import versions

_ORT_SKIP = ("CPUExecutionProvider", "AzureExecutionProvider")
_TRIPS = ("passive", "hot", "critical")
_NEAR_TRIP_C = 5.0  # a zone this close to its first trip point throttles at the next load spike


def _get(facts: dict[str, Any], *path: str) -> Any:
    node: Any = facts
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _cudnn_major(version: Any) -> int | None:
    # torch.backends.cudnn.version(): 8902 for 8.9.2, 90100 for 9.1.0 (the encoding changed in 9).
    if isinstance(version, int):
        return version // 10000 if version >= 10000 else version // 1000
    return versions.major(version) if version else None


def _mm(version: Any) -> tuple[int, ...]:
    return versions.parse(version)[:2] if version else ()


def derive(facts: dict[str, Any], tables: dict[str, Any]) -> dict[str, Any]:
    installed: dict[str, str] = _get(facts, "packages", "installed") or {}
    ort_facts = facts.get("onnxruntime") or {}
    ort_packages = sorted(n for n in installed if n == "onnxruntime" or n.startswith("onnxruntime-"))
    # Not rival builds of the onnxruntime import package: tools, and plugin EPs that install beside
    # onnxruntime (onnxruntime-ep-*, onnxruntime-qnn from 2.0 on).
    ort_packages = [
        n
        for n in ort_packages
        if n not in ("onnxruntime-tools", "onnxruntime-extensions", "onnxruntime-genai")
        and not n.startswith("onnxruntime-ep-")
        and not (n == "onnxruntime-qnn" and versions.matches(installed[n], ">=2"))
    ]
    providers = ort_facts.get("providers") or {}
    failed = sorted(
        p for p, e in providers.items() if p not in _ORT_SKIP and isinstance(e, dict) and e.get("starts") is False
    )
    errors = " | ".join(f"{p}: {providers[p].get('error') or 'no error raised'}" for p in failed)

    cudnn_majors = set()
    torch_cudnn = _cudnn_major(_get(facts, "torch", "cudnn"))
    if torch_cudnn is not None:
        cudnn_majors.add(torch_cudnn)
    for v in _get(facts, "libraries", "cudnn") or []:
        if (m := versions.major(v)) is not None:
            cudnn_majors.add(m)

    torch_cuda = _get(facts, "torch", "cuda")
    driver_cuda = _get(facts, "nvidia", "cuda_driver")
    runtime_cuda = torch_cuda or next(iter(_get(facts, "libraries", "cudart") or []), None)
    trt = next(iter(_get(facts, "libraries", "tensorrt") or []), None) or installed.get("tensorrt")

    pipeline = facts.get("pipeline") or {}
    want_rate, want_fps = pipeline.get("audio_rate_hz"), pipeline.get("video_fps")
    rate_mismatch = []
    if want_rate:
        for dev in _get(facts, "audio", "devices") or []:
            if dev.get("direction", "capture") == "capture" and dev.get("rate_hz") and dev["rate_hz"] != want_rate:
                rate_mismatch.append(f"{dev.get('id')} at {dev['rate_hz']} Hz")
        server = _get(facts, "audio", "sound_server") or {}
        if server.get("rate_hz") and server["rate_hz"] != want_rate:
            rate_mismatch.append(f"{server.get('name')} at {server['rate_hz']} Hz")
    fps_mismatch = []
    if want_fps:
        for dev in _get(facts, "video", "devices") or []:
            if dev.get("fps") and abs(dev["fps"] - want_fps) > 0.01:
                fps_mismatch.append(f"{dev.get('id')} at {dev['fps']:g} fps")

    total = _get(facts, "memory", "total_bytes")
    limit = _get(facts, "memory", "cgroup", "limit_bytes")

    hot = []
    for zone in _get(facts, "thermal", "zones") or []:
        trips = [t["temp_c"] for t in zone.get("trips") or [] if t.get("type") in _TRIPS and t.get("temp_c")]
        if zone.get("temp_c") is not None and trips and zone["temp_c"] >= min(trips) - _NEAR_TRIP_C:
            hot.append(f"{zone.get('type') or zone.get('name')} at {zone['temp_c']:g} °C (trip {min(trips):g} °C)")

    current = {
        "tensorrt": trt,
        "onnxruntime": ort_facts.get("version") or next((installed[n] for n in ort_packages), None),
        "openvino": installed.get("openvino"),
    }
    stale = []
    for entry in facts.get("caches") or []:
        built = entry.get("built_by") or {}
        differs = [
            f"{rt} {v} (now {current[rt]})" for rt, v in built.items() if current.get(rt) and _mm(v) != _mm(current[rt])
        ]
        if differs or entry.get("older_than_runtime"):
            stale.append(
                {
                    "kind": entry.get("kind"),
                    "path": entry.get("path"),
                    "why": "; ".join(differs) or "older than the runtime",
                }
            )

    ov_pairs: dict[str, str] = tables.get("openvino_pairs", {})
    ov_ort = installed.get("onnxruntime-openvino")
    ov_expected = ov_pairs.get(".".join(map(str, _mm(ov_ort)))) if ov_ort else None
    ov_have = installed.get("openvino")

    soc_text = " ".join(str(_get(facts, "platform", k) or "") for k in ("soc", "model")).strip()
    return {
        "ort_packages": ort_packages,
        "ort_package_count": len(ort_packages),
        "ort_version": current["onnxruntime"],
        "ort_failed_providers": failed,
        "ort_failed_errors": errors,
        "cudnn_majors": sorted(cudnn_majors),
        "has_cudnn8": 8 in cudnn_majors,
        "has_cudnn9": 9 in cudnn_majors,
        "torch_cuda_build": bool(torch_cuda),
        "cuda_runtime": runtime_cuda,
        "cuda_driver_too_old": bool(runtime_cuda and driver_cuda and _mm(runtime_cuda)[:1] > _mm(driver_cuda)[:1]),
        "tensorrt": trt,
        "tensorrt_major": versions.major(trt) if trt else None,
        "audio_rate_mismatches": rate_mismatch,
        "video_fps_mismatches": fps_mismatch,
        "cgroup_limit_bytes": limit,
        "cgroup_below_host": bool(limit and total and limit < total),
        "hot_zones": hot,
        "stale_caches": stale,
        "stale_cache_kinds": sorted({s["kind"] for s in stale if s["kind"]}),
        "openvino_expected": ov_expected,
        "openvino_pair_mismatch": bool(ov_expected and (not ov_have or _mm(ov_have) != _mm(ov_expected))),
        "soc": soc_text or None,
        "tensorrt_caches": [c.get("path") for c in facts.get("caches") or [] if c.get("kind") == "tensorrt"],
    }
