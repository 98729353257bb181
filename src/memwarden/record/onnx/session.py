"""Running an ONNX model under ORT with the profiler on: settings, feeds, one profiled session.

The capture needs two things ORT writes only when asked at session creation: the profile (the
kernels in execution order, with output shapes and allocator counters) and the optimized graph
(the nodes that actually ran, after fusion, with their consumers). So a session passed in by a
caller is re-created from its model with the same settings plus those two outputs.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.errors import InputError
from memwarden.record.onnx.bounded import RunLimits, run_bounded
from memwarden.record.onnx.feeds import load_feeds
from memwarden.record.onnx.twin import ENV_ALLOCATORS, register_splitting_arena, shadow_profile
from memwarden.untrusted import terminal_safe

__all__ = ["OrtSettings", "ProfiledRun", "load_feeds", "run_profiled", "settings_of"]

_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_OPT_LEVELS = ("disable", "basic", "extended", "all")


@dataclass(frozen=True, kw_only=True)
class OrtSettings:
    """The session settings a memory capture depends on."""

    ep: str = "cpu"
    arena: bool = True  # enable_cpu_mem_arena
    mem_pattern: bool = True  # enable_mem_pattern
    optimization: str = "all"  # graph_optimization_level
    intra_op_threads: int = 1  # one thread: the kernel order is the schedule, and runs are repeatable

    def label(self) -> str:
        return f"{self.ep}, arena {'on' if self.arena else 'off'}, mem-pattern {'on' if self.mem_pattern else 'off'}"

    def session_options(self) -> Any:
        import onnxruntime as ort

        if self.optimization not in _OPT_LEVELS:
            raise InputError(f"unknown optimization level {self.optimization!r} (valid: {', '.join(_OPT_LEVELS)})")
        so = ort.SessionOptions()
        so.enable_cpu_mem_arena = self.arena
        so.enable_mem_pattern = self.mem_pattern
        so.intra_op_num_threads = self.intra_op_threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3  # errors only: the optimized-model warning is expected here
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.optimization]
        return so

    def providers(self) -> list[str]:
        import onnxruntime as ort

        provider = _PROVIDERS.get(self.ep)
        if provider is None:
            raise InputError(f"unknown execution provider {self.ep!r} (valid: {', '.join(_PROVIDERS)})")
        if provider not in ort.get_available_providers():
            raise InputError(f"execution provider {self.ep!r} is not available in this onnxruntime build")
        return [provider]


def settings_of(session: Any) -> tuple[str | bytes, OrtSettings]:
    """The model (path or bytes) and the memory settings of an existing ``InferenceSession``."""
    source = getattr(session, "_model_path", None) or getattr(session, "_model_bytes", None)
    if not source:
        raise InputError("cannot recover the model of this InferenceSession; pass the model path instead")
    options = session.get_session_options()
    providers = session.get_providers()
    ep = "cuda" if providers and providers[0] == "CUDAExecutionProvider" else "cpu"
    return source, OrtSettings(
        ep=ep, arena=bool(options.enable_cpu_mem_arena), mem_pattern=bool(options.enable_mem_pattern)
    )


def _check_feeds(session: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    wanted = {i.name: i for i in session.get_inputs()}
    missing = sorted(set(wanted) - set(feeds))
    extra = sorted(set(feeds) - set(wanted))
    if missing or extra:
        raise InputError(
            terminal_safe(
                f"feeds do not match the model's inputs: missing {missing[:20] or 'none'}, unexpected "
                f"{extra[:20] or 'none'} (model inputs: {', '.join(list(wanted)[:20])})"
            )[:600]
        )
    out = {}
    for name, value in feeds.items():
        array = np.asarray(value, order="C")  # ascontiguousarray would make a 0-d feed 1-d
        if array.dtype == object:
            raise InputError(f"feed {terminal_safe(name)[:80]!r} holds Python objects; give numeric arrays")
        shape = wanted[name].shape
        if len(shape) != array.ndim or any(
            isinstance(d, int) and d != n for d, n in zip(shape, array.shape, strict=False)
        ):
            raise InputError(
                terminal_safe(f"feed {name[:80]!r} has shape {tuple(array.shape)}; the model wants {shape}")
            )
        out[name] = array
    return out


@dataclass
class ProfiledRun:
    """What one profiled session left behind: its profile and optimized graph (in ``workdir``)."""

    profile_path: Path
    shadow_profile_path: Path | None  # arena-on twin of an arena-off run: ORT's counters for the same plan
    optimized_path: Path | None
    workdir: tempfile.TemporaryDirectory[str]
    feeds: list[dict[str, np.ndarray]]
    output_names: list[str]


def run_profiled(
    source: str | Path | bytes,
    feeds: Sequence[Mapping[str, np.ndarray]],
    settings: OrtSettings,
    *,
    limits: RunLimits | None = None,
) -> ProfiledRun:
    """Create a profiled session of ``source`` and run it once per feed set.

    With the arena off ORT writes no allocator counters, so a twin session with the arena on
    runs the same feeds: ORT's allocation plan (which value reuses which buffer, when each is
    released) does not depend on the arena, only the counters do. On the CPU EP the twin runs in
    a fresh interpreter on an arena that splits every chunk (``memwarden.record.onnx.twin``), so
    its high-water mark rises by a kernel's scratch, not by the chunk the scratch was given.

    With ``limits`` (a model with control flow that has no bound) every session runs in a child
    process under those limits (``memwarden.record.onnx.bounded``). The work folder is removed on
    any failure; on success the caller removes it (``ProfiledRun.workdir``)."""
    workdir = tempfile.TemporaryDirectory(prefix="memwarden-ort-")
    try:
        if limits is not None:
            probe = _checked_feeds(source, feeds, settings)
            path, names = run_bounded(
                source, probe, settings, Path(workdir.name), "profile", optimized=True, limits=limits
            )
            main = (path, probe, names)
        else:
            main = profiled_session(source, feeds, settings, Path(workdir.name), "profile", optimized=True)
        checked = main[1]
        shadow = None
        if not settings.arena:
            twin = OrtSettings(
                ep=settings.ep,
                arena=True,
                mem_pattern=settings.mem_pattern,
                optimization=settings.optimization,
                intra_op_threads=settings.intra_op_threads,
            )
            # else (another EP, an older onnxruntime, a failed child) here, on the default arena
            if limits is not None:
                shadow = run_bounded(
                    source, checked, twin, Path(workdir.name), "shadow", optimized=False, limits=limits
                )[0]
            elif settings.ep == "cpu":
                shadow = shadow_profile(source, checked, asdict(twin), Path(workdir.name))
            if shadow is None:
                shadow = profiled_session(source, feeds, twin, Path(workdir.name), "shadow", optimized=False)[0]
    except BaseException:
        workdir.cleanup()
        raise
    profile, _, output_names = main
    optimized = Path(workdir.name) / "optimized.onnx"
    return ProfiledRun(
        profile_path=profile,
        shadow_profile_path=shadow,
        optimized_path=optimized if optimized.is_file() else None,
        workdir=workdir,
        feeds=checked,
        output_names=output_names,
    )


def _checked_feeds(
    source: str | Path | bytes, feeds: Sequence[Mapping[str, np.ndarray]], settings: OrtSettings
) -> list[dict[str, np.ndarray]]:
    """``feeds`` checked against the inputs of a session that is created but never run."""
    import onnxruntime as ort

    so = settings.session_options()
    so.log_severity_level = 4
    try:
        session = ort.InferenceSession(
            source if isinstance(source, bytes) else str(source), so, providers=settings.providers()
        )
    except Exception as exc:  # ORT's pybind errors share no base
        raise InputError(f"onnxruntime cannot load the model: {_first_line(exc)}") from None
    return [_check_feeds(session, f) for f in feeds]


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()
    return terminal_safe(text[0] if text else type(exc).__name__)[:300]


def profiled_session(
    source: str | Path | bytes,
    feeds: Sequence[Mapping[str, np.ndarray]],
    settings: OrtSettings,
    workdir: Path,
    prefix: str,
    *,
    optimized: bool,
    env_allocators: bool = False,
) -> tuple[Path, list[dict[str, np.ndarray]], list[str]]:
    import onnxruntime as ort

    so = settings.session_options()
    so.enable_profiling = True
    so.profile_file_prefix = str(workdir / prefix)
    # fatal only: a session that fails to load still ends its profile when it is destroyed and logs
    # an error line for it; every failure reaches the caller as an exception, reported in one line
    so.log_severity_level = 4
    if env_allocators:  # the process's registered allocators (``twin.register_splitting_arena``)
        so.add_session_config_entry(ENV_ALLOCATORS, "1")
    if optimized:
        so.optimized_model_filepath = str(workdir / "optimized.onnx")
    model = source if isinstance(source, bytes) else str(source)
    providers = settings.providers()
    try:
        session = ort.InferenceSession(model, so, providers=providers)
    except Exception as exc:  # ORT's pybind errors (Fail, InvalidGraph, InvalidProtobuf, ...) share no base
        raise InputError(f"onnxruntime cannot load the model: {_first_line(exc)}") from None
    checked = [_check_feeds(session, f) for f in feeds]
    try:
        for f in checked:
            session.run(None, f)
    except Exception as exc:  # as above: a graph ORT loaded can still fail on these inputs
        raise InputError(f"onnxruntime failed to run the model: {_first_line(exc)}") from None
    return Path(session.end_profiling()), checked, [o.name for o in session.get_outputs()]


def _twin_child(config: dict[str, Any]) -> str:
    """In a fresh interpreter: the twin's profile on the splitting arena (``twin.shadow_profile``)."""
    if not register_splitting_arena():
        raise SystemExit(3)
    feeds = [load_feeds(p) for p in config["feeds"]]
    settings = OrtSettings(**config["settings"])
    return str(
        profiled_session(
            config["model"], feeds, settings, Path(config["workdir"]), "shadow", optimized=False, env_allocators=True
        )[0]
    )


if __name__ == "__main__":
    print(_twin_child(json.loads(sys.argv[1])))
