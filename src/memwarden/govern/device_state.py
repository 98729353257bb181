"""The memory a device really has now, from pasted state, and whether one allocation fits it.

The model (what one more allocation of a kind can get):

- ``cuda`` on an integrated GPU (Jetson, GB10): device memory is system memory, so the bound is
  **MemAvailable** — the page cache counts as reclaimable and MemFree does not. ``cuMemGetInfo``
  reports MemFree there (ollama #12283), which is why vLLM and SGLang switched to
  ``psutil.virtual_memory().available`` on integrated GPUs (sglang #10075, vllm #48140); the
  reported free figure is shown but bounds nothing. **Swap does not back device memory** (it is
  pinned), so it is shown and not counted. ``lfb`` (tegrastats) is the largest free *physically
  contiguous* block, at most 4 MB by design (NVIDIA's tegrastats appendix: "Allocations of virtual
  memory can be bigger"): cudaMalloc on Tegra maps scattered pages through the SMMU, so lfb does not
  bound it; it bounds physically contiguous buffers (kind ``contiguous``: CMA/carve-out users such as
  camera and codec buffers), and a low count is shown as fragmentation. Known platform defects
  (``platform_facts``: L4T R36.4.7's NvMap change) turn a ``cuda`` verdict to ``fails`` on their own
  when they carry a source.
- ``cuda`` on a discrete GPU: the device's free figure.
- ``host`` (anonymous memory): MemAvailable plus free swap (the kernel can page anonymous memory out).
- ``mmap`` (file-backed weights): MemAvailable; swap never holds file pages, and a mapping bigger
  than that is re-read from disk, not refused.
- ``contiguous``: the largest of the lfb block and CmaFree.

Pure functions over lines; :func:`load_state` is the one reader of a file.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from memwarden.govern.device_state_context import ParseContext
from memwarden.govern.device_state_lines import Figure, parse_line
from memwarden.govern.platform_facts import facts_for
from memwarden.untrusted import open_regular

__all__ = [
    "KINDS",
    "Component",
    "DeviceState",
    "Obtainable",
    "StateRead",
    "Verdict",
    "judge",
    "load_state",
    "obtainable",
    "read_state",
    "state_lines",
]

KINDS = ("cuda", "host", "mmap", "contiguous")
MAX_STATE_BYTES = 128 << 20  # the telemetry log's limit: a paste past this is no paste
_MAX_LINE_BYTES = 64 << 10
_STICKY = ("l4t", "jetpack", "device_name")  # facts of the platform, not of a moment: carried forward
_INTEGRATED_NAMES = re.compile(r"orin|thor|xavier|tegra|jetson|\bnano\b|tx[12]\b|gb10|spark", re.IGNORECASE)
_SKIP_PREFIX = "##"  # a fixture's or a user's own comment lines (one '#' is nv_tegra_release's)


@dataclass(frozen=True, kw_only=True)
class Component:
    """One term of what is obtainable: ``counts`` says whether it makes up or bounds the figure for
    the kind asked, ``line`` is the source line (and ``line_no`` its number) it was read from."""

    name: str
    bytes: int
    counts: bool
    note: str
    line: str
    line_no: int

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "counts": self.counts,
            "note": self.note,
            "line": self.line,
            "line_no": self.line_no,
        }


@dataclass(frozen=True)
class DeviceState:
    """One sample: the latest figure of each field (platform facts carried from earlier lines)."""

    figures: dict[str, Figure]

    def value(self, name: str) -> Any:
        fig = self.figures.get(name)
        return None if fig is None else fig.value

    @property
    def integrated(self) -> bool | None:
        """True when the paste shows a unified-memory platform, False when it shows a discrete GPU
        (a device total unlike the host's), None when it cannot tell."""
        f = self.figures
        if any(k in f for k in ("l4t", "jetpack", "lfb_block", "nvmap_used", "nvmap_clients_total")):
            return True
        if (name := self.value("device_name")) and _INTEGRATED_NAMES.search(str(name)):
            return True
        dev_total, dev_free = self.value("device_total"), self.value("device_free")
        host = [self.value(k) for k in ("mem_free", "mem_available")]
        if dev_free is not None and any(h and abs(h - dev_free) <= 0.03 * h for h in host):
            return True  # cuMemGetInfo returned a host figure: the device is the host's memory
        mem_total = self.value("mem_total")
        if dev_total is not None and mem_total is not None:
            return abs(dev_total - mem_total) <= 0.05 * mem_total
        return None


@dataclass(frozen=True, kw_only=True)
class StateRead:
    samples: list[DeviceState]
    lines: int
    recognised: int
    skipped: int
    by_format: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "recognised": self.recognised,
            "skipped": self.skipped,
            "by_format": dict(sorted(self.by_format.items())),
            "samples": len(self.samples),
        }


def read_state(lines: Iterable[str]) -> StateRead:
    """Lines of any mixture of formats -> samples. A sample ends where a line gives a field the
    sample already has (the next tegrastats line, a second meminfo dump). Unknown lines are counted
    and skipped. Work is linear in the text: each line is cut at a fixed length before matching."""
    samples: list[DeviceState] = []
    current: dict[str, Figure] = {}
    ctx = ParseContext()
    n = recognised = skipped = 0
    by_format: Counter[str] = Counter()
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith(_SKIP_PREFIX) or not line.strip():
            continue
        figures = parse_line(line, n, ctx)
        if figures is None:
            skipped += 1
            continue
        recognised += 1
        if figures:
            by_format[figures[0].fmt] += 1
        if any(f.field in current and f.field not in _STICKY and current[f.field].line_no != n for f in figures):
            samples.append(DeviceState(dict(current)))
            current = {k: v for k, v in current.items() if k in _STICKY}
        for f in figures:
            current[f.field] = f
    if any(k not in _STICKY for k in current) or (current and not samples):
        samples.append(DeviceState(current))
    return StateRead(samples=samples, lines=n, recognised=recognised, skipped=skipped, by_format=dict(by_format))


def state_lines(path: str | os.PathLike[str]) -> Iterator[str]:
    """The file's lines, at most ``MAX_STATE_BYTES`` in all; a bad byte becomes U+FFFD (a paste with
    one is still a paste), a line longer than 64 KiB is read in pieces."""
    from memwarden.errors import InputError
    from memwarden.untrusted import terminal_safe

    label = terminal_safe(path)
    total = 0
    with open_regular(path, label, "a pasted device state") as fh:
        while raw := fh.readline(_MAX_LINE_BYTES):
            total += len(raw)
            if total > MAX_STATE_BYTES:
                raise InputError(f"{label}: over the {MAX_STATE_BYTES}-byte limit for a device-state paste")
            yield raw.decode("utf-8", errors="replace")


def load_state(path: str | os.PathLike[str]) -> StateRead:
    """A pasted state file (regular file, at most ``MAX_STATE_BYTES``); see :func:`read_state`."""
    return read_state(state_lines(path))


@dataclass(frozen=True, kw_only=True)
class Obtainable:
    bytes: int | None
    components: dict[str, Component]
    basis: str  # which figure makes ``bytes``, in words


def _component(state: DeviceState, field_name: str, name: str, counts: bool, note: str) -> Component | None:
    fig = state.figures.get(field_name)
    if fig is None or not isinstance(fig.value, int):
        return None
    return Component(name=name, bytes=fig.value, counts=counts, note=note, line=fig.line, line_no=fig.line_no)


def obtainable(state: DeviceState, kind: str) -> Obtainable:
    """What one more allocation of ``kind`` can get in this state, with its components."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: expected one of {', '.join(KINDS)}")
    integrated = state.integrated
    on_device = kind == "cuda" and integrated is False
    comps: dict[str, Component] = {}

    def add(field_name: str, name: str, counts: bool, note: str) -> None:
        if (c := _component(state, field_name, name, counts, note)) is not None:
            comps[name] = c

    host_counts = not on_device and kind != "contiguous"
    add("mem_available", "available", host_counts, "MemAvailable: free memory plus what the kernel reclaims")
    add("cached", "reclaimable_cache", False, "page cache: reclaimable, already inside MemAvailable")
    add("mem_free", "mem_free", False, "MemFree: leaves the reclaimable cache out, so it understates")
    free_note = (
        "cuMemGetInfo on an integrated GPU reports MemFree, not MemAvailable (ollama #12283): shown, bounds nothing"
        if integrated is not False
        else "the device's own free memory"
    )
    add("device_free", "reported_device_free", on_device, free_note)
    add("device_total", "device_total", False, "the device's total")
    add("mem_total", "total", False, "the spec-sheet figure: what the naive reading compares with")
    swap_note = (
        "free swap: the kernel can page anonymous memory out"
        if kind == "host"
        else "free swap: does not back GPU memory (pinned) or file pages"
    )
    add("swap_free", "swap_free", kind == "host", swap_note)
    add("cma_free", "cma_free", kind == "contiguous", "CmaFree: the contiguous-memory area still free")
    add("nvmap_used", "gpu_clients_hold", False, "NvMapMemUsed: what GPU clients (all processes) hold now")
    if (top := state.value("nvmap_top_client")) is not None:
        top_note = f"; the largest: {top}, {int(state.value('nvmap_top_client_bytes') or 0) >> 20} MiB"
    else:
        top_note = ""
    add(
        "nvmap_clients_total",
        "gpu_clients_hold_nvmap",
        False,
        "NvMap iovmm clients: GPU buffers every process "
        f"holds, already outside MemAvailable (not subtracted twice){top_note}",
    )
    add(
        "lmkd_killed_rss",
        "lmkd_killed",
        False,
        f"lmkd killed {state.value('lmkd_kill')}: the device is under "
        "pressure; a process at that oom_score_adj or above is next",
    )
    add(
        "android_free_ram",
        "android_free_ram",
        False,
        "dumpsys Free RAM: free + cached kernel + cached processes lmkd kills first",
    )
    if (lfb := state.value("lfb_block")) is not None and (count := state.value("lfb_count")) is not None:
        fig = state.figures["lfb_block"]
        comps["largest_free_block"] = Component(
            name="largest_free_block",
            bytes=int(lfb),
            counts=kind == "contiguous",
            line=fig.line,
            line_no=fig.line_no,
            note=(
                f"tegrastats lfb {count}x{_block(int(lfb))}: largest physically contiguous free block (at most "
                "4 MB by design); bounds contiguous buffers, not cudaMalloc (SMMU-mapped pages)"
            ),
        )

    if kind == "contiguous":
        terms = [c.bytes for n, c in comps.items() if n in ("largest_free_block", "cma_free")]
        return Obtainable(
            bytes=max(terms) if terms else None, components=comps, basis="the largest of the lfb block and CmaFree"
        )
    if on_device:
        dev = state.value("device_free")
        return Obtainable(bytes=dev, components=comps, basis="the discrete device's free memory")
    base, basis = state.value("mem_available"), "MemAvailable"
    if base is None and (free := state.value("mem_free")) is not None and (cache := state.value("cached")) is not None:
        base, basis = free + cache, "MemFree + page cache (no MemAvailable line: an upper estimate)"
        comps["reclaimable_cache"] = _component(state, "cached", "reclaimable_cache", True, "page cache, reclaimable")  # type: ignore[assignment]
        comps["mem_free"] = _component(state, "mem_free", "mem_free", True, "MemFree")  # type: ignore[assignment]
    if base is None and (dev := state.value("device_free")) is not None:
        base, basis = dev, "the reported device free figure (on an integrated GPU it is MemFree: a lower bound)"
        comps["reported_device_free"] = Component(**{**comps["reported_device_free"].__dict__, "counts": True})
    if base is None and (android := state.value("android_free_ram")) is not None:
        base, basis = android, "dumpsys Free RAM (counts cached apps lmkd would kill: an upper estimate)"
        comps["android_free_ram"] = Component(**{**comps["android_free_ram"].__dict__, "counts": True})
    if base is not None and kind == "cuda" and integrated and (cma := state.value("cma_free")) is not None:
        # CMA pageblocks take movable pages only; pinned GPU buffers cannot live there, yet MemFree
        # and MemAvailable count CmaFree (Toradex's CMA article; the kernel migrates long-term pins
        # out of CMA). What a cudaMalloc can get is the rest.
        base, basis = max(0, base - cma), f"{basis} - CmaFree (CMA takes movable pages only)"
        comps["cma_free"] = Component(
            **{
                **comps["cma_free"].__dict__,
                "counts": True,
                "note": (
                    "CmaFree: inside MemAvailable, but only movable pages may use it, never pinned GPU buffers: subtracted"
                ),
            }
        )
    if kind == "host" and base is not None and (swap := state.value("swap_free")) is not None:
        base, basis = base + swap, f"{basis} + free swap"
    return _phone_caps(state, base, basis, comps)


def _phone_caps(state: DeviceState, base: int | None, basis: str, comps: dict[str, Component]) -> Obtainable:
    """An iPhone's own ceilings: what ``os_proc_available_memory`` says the app may still allocate,
    and the jetsam per-process limit a report shows (the app's whole footprint must stay under it,
    so one allocation gets at most that, less what the app already holds)."""
    caps = [
        (
            "os_proc_available",
            "os_proc_available",
            "os_proc_available_memory(): what this app may still allocate before jetsam kills it",
        ),
        (
            "jetsam_limit",
            "jetsam_per_process_limit",
            "jetsam per-process-limit: rpages x pageSize of the app killed "
            f"at its limit ({state.value('jetsam_killed') or 'name not in the paste'}"
            f"{', pageSize assumed 16 KiB' if state.value('jetsam_page_size_assumed') else ''}); the app's whole "
            "footprint must stay under it",
        ),
    ]
    for field_name, name, note in caps:
        value = state.value(field_name)
        if not isinstance(value, int):
            continue
        fig = state.figures[field_name]
        binds = base is None or value < base
        comps[name] = Component(name=name, bytes=value, counts=binds, note=note, line=fig.line, line_no=fig.line_no)
        if binds:
            base, basis = (
                value,
                (f"{name.replace('_', ' ')} (below {basis})" if base is not None else name.replace("_", " ")),
            )
    if base is None:
        return Obtainable(bytes=None, components=comps, basis="no memory figure")
    return Obtainable(bytes=base, components=comps, basis=basis)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    verdict: str  # "fits" | "fails"
    obtainable_bytes: int | None
    components: dict[str, Component]
    reason: str
    request_bytes: int
    kind: str
    naive: dict[str, bool | None] = field(default_factory=dict)
    platform_issues: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "obtainable_bytes": self.obtainable_bytes,
            "components": {k: c.to_json() for k, c in self.components.items()},
            "reason": self.reason,
            "request_bytes": self.request_bytes,
            "kind": self.kind,
            "naive": self.naive,
            "platform_issues": self.platform_issues,
        }


def _block(n: int) -> str:
    """A block size as tegrastats prints it: whole MB, else kB (older boards print ``lfb 1x512kB``)."""
    return f"{n >> 20}MB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10}kB"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _contiguous(state: DeviceState, kind: str, largest_buffer_bytes: int) -> tuple[Component | None, int | None] | None:
    """The request judged buffer by buffer against tegrastats' ``lfb NxSIZE``: each buffer needs one
    free block, so a buffer larger than SIZE cannot be placed in the free blocks (only CMA, where
    CmaFree is known, can still hold it), while many buffers of at most SIZE fit up to N blocks.
    Returns the component and, for ``contiguous`` requests, the bytes they can get (None: no bound)."""
    block, count = state.value("lfb_block"), state.value("lfb_count")
    if not isinstance(block, int) or not isinstance(count, int) or largest_buffer_bytes <= block:
        if kind == "contiguous" and isinstance(block, int) and isinstance(count, int):
            return None, max(count * block, int(state.value("cma_free") or 0))
        return None
    fig = state.figures["lfb_block"]
    cma = state.value("cma_free")
    fits_cma = isinstance(cma, int) and largest_buffer_bytes <= cma
    note = (
        f"the request's largest buffer ({_block(largest_buffer_bytes)}) is larger than the largest free "
        f"contiguous block (lfb {count}x{_block(block)})"
    )
    if kind == "contiguous":
        note += "; CmaFree can still hold it" if fits_cma else "; no free block or CMA area holds it: it fails"
    else:
        note += (
            "; cudaMalloc on Tegra maps scattered pages through the SMMU, so this matters only for buffers "
            "that must be physically contiguous (camera, codec, NvBufSurface)"
        )
    comp = Component(
        name="does_not_fit_contiguously",
        bytes=largest_buffer_bytes,
        counts=kind == "contiguous",
        note=note,
        line=fig.line,
        line_no=fig.line_no,
    )
    if kind != "contiguous":
        return comp, None
    return comp, int(cma) if fits_cma and isinstance(cma, int) else 0


def judge(
    state: DeviceState, request_bytes: int, kind: str = "cuda", *, largest_buffer_bytes: int | None = None
) -> Verdict:
    """Does one allocation of ``request_bytes`` of ``kind`` succeed in ``state``? Beside it, the
    naive readings: request <= MemAvailable, <= the total, <= the reported device free figure.
    With ``largest_buffer_bytes`` (the request's single largest buffer) it is also judged buffer by
    buffer against the largest free contiguous block (:func:`_contiguous`)."""
    ob = obtainable(state, kind)
    if largest_buffer_bytes is not None and largest_buffer_bytes > request_bytes:
        raise ValueError("the largest buffer cannot be larger than the whole request")
    contiguous = None if largest_buffer_bytes is None else _contiguous(state, kind, largest_buffer_bytes)
    if contiguous is not None:
        comp, bound = contiguous
        components = dict(ob.components)
        if comp is not None:
            components[comp.name] = comp
        basis = ob.basis
        if bound is not None:
            basis = "buffer by buffer: the lfb blocks (or CmaFree) that can hold the request's buffers"
        ob = Obtainable(bytes=ob.bytes if bound is None else bound, components=components, basis=basis)
    total = state.value("mem_total") or state.value("device_total")
    avail, dev_free = state.value("mem_available"), state.value("device_free")
    naive = {
        "request_le_mem_available": None if avail is None else request_bytes <= avail,
        "request_le_total": None if total is None else request_bytes <= total,
        "request_le_reported_free": None if dev_free is None else request_bytes <= dev_free,
        "request_le_mem_free": None if (mem_free := state.value("mem_free")) is None else request_bytes <= mem_free,
    }
    issues = facts_for(state.value("l4t"), kind)
    issues_json = [
        {"id": f.id, "effect": f.effect, "fix": f.fix, "sources": list(f.sources), "verified": f.verified}
        for f in issues
    ]
    if ob.bytes is None:
        raise ValueError("no memory figure in the state: nothing to judge the request against")
    verified = [f for f in issues if f.verified]
    if verified:
        f = verified[0]
        verdict, reason = "fails", f"L4T {state.value('l4t')}: {f.effect}; fix: {f.fix}"
    elif request_bytes <= ob.bytes:
        verdict, reason = "fits", f"{_gib(request_bytes)} <= {_gib(ob.bytes)} obtainable ({ob.basis})"
    else:
        verdict, reason = "fails", f"{_gib(request_bytes)} > {_gib(ob.bytes)} obtainable ({ob.basis})"
    return Verdict(
        verdict=verdict,
        reason=reason,
        obtainable_bytes=ob.bytes,
        components=ob.components,
        request_bytes=request_bytes,
        kind=kind,
        naive=naive,
        platform_issues=issues_json,
    )
