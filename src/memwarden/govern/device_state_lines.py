"""Memory-state lines as users paste them: one parser per source format, detected per line.

Each parser takes one line and returns the figures it carries as :class:`Figure` values (a field
name, a value, the line it came from), or ``None`` when the line is not of its format. The first
parser that recognises a line wins (most specific first: a tegrastats line also says ``SWAP``,
which the person-written parser would half-read). Nothing here raises on a line: a number too
large to be memory, a unit it does not know, a line of binary noise are all "not recognised".

Formats (fields are bytes unless named otherwise):

- ``tegrastats`` (JetPack 4, 5, 6): ``RAM used/totalMB (lfb NxSIZE) SWAP used/totalMB (cached
  NMB)``; ``lfb`` is the count and size of the largest free physically contiguous blocks
  (NVIDIA's tegrastats appendix, L4T 32.5: "at most 4 MB ... Allocations of virtual memory can be
  bigger"). JetPack 6 prefixes a timestamp; that changes nothing here.
- ``/proc/meminfo``: ``Key:  N kB`` (and ``Key=N kB`` as people quote it inline).
- ``free`` (``-b``/``-k``/``-m``/``-g``/``-h``): the ``Mem:`` and ``Swap:`` rows.
- ``/proc/pressure/memory`` (PSI): ``some avg10=.. avg60=.. avg300=.. total=..`` (percent, not bytes).
- CUDA's own figures: ``torch.cuda.mem_get_info()`` tuples, ``cudaMemGetInfo`` printouts, vLLM's
  ``Free memory on device [cuda:0] (F/T GiB)``, llama.cpp/ollama device lines
  ``CUDA0 : Orin (7619 MiB, 3875 MiB free)`` and ``using device CUDA0 (Orin) - 3875 MiB free``.
- The platform: ``/etc/nv_tegra_release`` (``# R36 (release), REVISION: 4.7``), ``L4T R36.4.7``,
  ``nvidia-l4t-core 36.4.7``, ``JetPack 6.2``.
- A person's own summary: ``Available: 1.5GB``, ``Swap 1.9GB / 14GB``, ``free=66GB cache=51GB
  available=116GB``, ``Buffer/Cache: 6.4GB``. Their ``GB``/``MB`` are read as GiB/MiB, as tegrastats
  and ``free -h`` mean them.
- jtop's memory dict and NvMap's ``iovmm/clients`` table (``device_state_jetson``); iOS jetsam
  reports, ``os_proc_available_memory``, Android ``dumpsys meminfo``, lmkd kills and trim levels
  (``device_state_phone``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from memwarden.govern.device_state_context import ParseContext
from memwarden.govern.device_state_jetson import jtop_line, nvmap_clients_line
from memwarden.govern.device_state_phone import android_line, jetsam_line, os_proc_line

__all__ = ["FORMATS", "Figure", "parse_line"]

_KIB, _MIB, _GIB, _TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
_MAX_BYTES = 1 << 62
_MAX_LINE_CHARS = 4096  # a state line is short; a longer one is read only up to here (work stays linear)
_UNITS = {
    "b": 1,
    "": 1,
    "k": _KIB,
    "kb": _KIB,
    "kib": _KIB,
    "ki": _KIB,
    "m": _MIB,
    "mb": _MIB,
    "mib": _MIB,
    "mi": _MIB,
    "g": _GIB,
    "gb": _GIB,
    "gib": _GIB,
    "gi": _GIB,
    "t": _TIB,
    "tb": _TIB,
    "tib": _TIB,
    "ti": _TIB,
}
_NUM = r"(\d{1,15}(?:\.\d{1,6})?)"


@dataclass(frozen=True)
class Figure:
    """One value read from one line: ``field`` names it, ``value`` is bytes (an int) for memory
    fields, percent for ``psi_*``, and a version string for ``l4t``/``jetpack``."""

    field: str
    value: int | float | str
    fmt: str  # the format that recognised the line
    line_no: int
    line: str


def _bytes(number: str, unit: str) -> int | None:
    scale = _UNITS.get(unit.lower())
    if scale is None:
        return None
    value = int(float(number) * scale)
    return value if 0 <= value <= _MAX_BYTES else None


# --- tegrastats ------------------------------------------------------------------------------

_TEGRA_RAM = re.compile(r"\bRAM (\d{1,12})/(\d{1,12})(kB|KB|MB|GB)(?: \(lfb (\d{1,9})x(\d{1,9})(kB|KB|MB)\))?")
_TEGRA_SWAP = re.compile(r"\bSWAP (\d{1,12})/(\d{1,12})(kB|KB|MB|GB)(?: \(cached (\d{1,12})(kB|KB|MB|GB)\))?")


def _tegrastats(line: str, ctx: ParseContext) -> list[tuple[str, int | float | str]] | None:
    ram = _TEGRA_RAM.search(line)
    if ram is None:
        return None
    used, total = _bytes(ram.group(1), ram.group(3)), _bytes(ram.group(2), ram.group(3))
    if used is None or total is None or used > total:
        return None
    # tegrastats' "used" leaves the page cache out (MemTotal - MemAvailable), so total - used is
    # what the kernel would give without swapping: the MemAvailable of this line.
    out: list[tuple[str, int | float | str]] = [("mem_total", total), ("mem_available", total - used)]
    if ram.group(4) is not None:
        block = _bytes(ram.group(5), ram.group(6))
        if block is not None:
            out += [("lfb_count", int(ram.group(4))), ("lfb_block", block)]
    swap = _TEGRA_SWAP.search(line)
    if swap is not None:
        s_used, s_total = _bytes(swap.group(1), swap.group(3)), _bytes(swap.group(2), swap.group(3))
        if s_used is not None and s_total is not None and s_used <= s_total:
            out += [("swap_total", s_total), ("swap_free", s_total - s_used)]
    return out


# --- /proc/meminfo -----------------------------------------------------------------------------

_MEMINFO_KEYS = {
    "MemTotal": "mem_total",
    "MemFree": "mem_free",
    "MemAvailable": "mem_available",
    "Buffers": "buffers",
    "Cached": "cached",
    "SwapTotal": "swap_total",
    "SwapFree": "swap_free",
    "CmaTotal": "cma_total",
    "CmaFree": "cma_free",
    "NvMapMemUsed": "nvmap_used",
    "NvMapMemFree": "nvmap_free",
    "SReclaimable": "slab_reclaimable",
}
_MEMINFO = re.compile(r"\b(" + "|".join(_MEMINFO_KEYS) + r")\s*[:=]\s*(\d{1,15})\s*(kB|KB)?\b")


def _meminfo(line: str, ctx: ParseContext) -> list[tuple[str, int | float | str]] | None:
    found = _MEMINFO.findall(line)
    if not found:
        return None
    out: list[tuple[str, int | float | str]] = []
    for key, number, unit in found:  # /proc/meminfo's "kB" is KiB; a bare number there is a count
        value = _bytes(number, "k" if unit else "")
        if value is not None:
            out.append((_MEMINFO_KEYS[key], value))
    return out or None


# --- free ----------------------------------------------------------------------------------------

_FREE_CMD = re.compile(r"\bfree\s+(?:-\w+\s+)*-([bkmgh])\b|\bfree\s+--(bytes|kibi|mebi|gibi|human)\b")
_FREE_ROW = re.compile(r"^\s*(Mem|Swap):((?:\s+\d{1,15}(?:[.,]\d+)?[KMGTB]?i?)+)\s*$")
_FREE_HEAD = re.compile(r"^\s*total\s+used\s+free\b")


def _free_value(token: str, unit: int) -> int | None:
    m = re.fullmatch(r"(\d{1,15}(?:[.,]\d+)?)([KMGTB]?i?)", token)
    if m is None:
        return None
    number = m.group(1).replace(",", ".")
    if m.group(2):  # free -h: 7.4Gi, 512Mi, 0B
        return _bytes(number, m.group(2))
    return _bytes(number, "") if unit == 1 else int(float(number) * unit)


def _free(line: str, ctx: ParseContext) -> list[tuple[str, int | float | str]] | None:
    cmd = _FREE_CMD.search(line)
    if cmd is not None:
        flag = cmd.group(1) or {"bytes": "b", "kibi": "k", "mebi": "m", "gibi": "g", "human": "h"}[cmd.group(2)]
        ctx.free_unit_bytes = {"b": 1, "k": _KIB, "m": _MIB, "g": _GIB, "h": 1}[flag]
        return []  # recognised (it sets the unit of the rows below), no figure of its own
    if _FREE_HEAD.match(line):
        return []
    row = _FREE_ROW.match(line)
    if row is None:
        return None
    tokens = row.group(2).split()
    if ctx.free_unit_bytes is None and not any(t[-1].isalpha() for t in tokens):
        # No command line above: plain `free` prints KiB, `free -m` MiB. A total under 128 Ki units
        # read as KiB would be a board of under 128 MiB, so it is MiB (Jetson Thor's 128 GB is
        # ~125000 MiB); a larger one is KiB.
        ctx.free_unit_bytes = _MIB if int(float(tokens[0].replace(",", "."))) < (1 << 17) else _KIB
    unit = ctx.free_unit_bytes or _KIB
    values = [_free_value(t, unit) for t in tokens]
    if any(v is None for v in values):
        return None
    nums = [v for v in values if v is not None]
    if row.group(1) == "Swap":
        return [("swap_total", nums[0]), ("swap_free", nums[2])] if len(nums) >= 3 else None
    if len(nums) >= 6:  # total used free shared buff/cache available
        return [("mem_total", nums[0]), ("mem_free", nums[2]), ("cached", nums[4]), ("mem_available", nums[5])]
    if len(nums) >= 3:  # an old procps without "available"
        return [("mem_total", nums[0]), ("mem_free", nums[2])]
    return None


# --- PSI ---------------------------------------------------------------------------------------------

_PSI = re.compile(r"^\s*(some|full)\s+avg10=(\d{1,3}\.\d{1,2})\s+avg60=(\d{1,3}\.\d{1,2})\s+avg300=(\d{1,3}\.\d{1,2})")


def _psi(line: str, ctx: ParseContext) -> list[tuple[str, int | float | str]] | None:
    m = _PSI.match(line)
    if m is None:
        return None
    kind = m.group(1)
    return [(f"psi_{kind}_avg10", float(m.group(2))), (f"psi_{kind}_avg60", float(m.group(3)))]


# --- CUDA's own figures ------------------------------------------------------------------------------

_DEVICE_LINE = re.compile(
    r"\b(?:CUDA\d+|ROCm\d+|Vulkan\d+)\s*:\s*([^()]{1,120}?)\s*\((\d{1,9}) MiB, (\d{1,9}) MiB free\)"
)
_USING_DEVICE = re.compile(
    r"using device (?:CUDA|ROCm|Vulkan)\d+ \([^)]{1,120}\) (?:\([^)]{0,40}\) )?- (\d{1,9}) MiB free"
)
# vLLM's start check; before 0.10 it named no device ("Free memory on device (F/T GiB) on startup ...")
_VLLM_FREE = re.compile(r"[Ff]ree memory on device(?: \S{1,20})? \(" + _NUM + r"/" + _NUM + r" (GiB|MiB)\)")
_TUPLE = re.compile(r"(?:mem_get_info\S*\s*(?:->|=|:)?\s*)?\((\d{1,15}),\s*(\d{1,15})\)\s*$")
_CUDA_INFO = re.compile(
    r"(?:cudaMemGetInfo|cuMemGetInfo|mem_get_info)\S*[^0-9]{0,40}?free\s*[:=]?\s*" + _NUM + r"\s*([KMGT]i?B?|B|bytes)?"
    r"[^0-9]{1,20}total\s*[:=]?\s*" + _NUM + r"\s*([KMGT]i?B?|B|bytes)?",
    re.IGNORECASE,
)
_OLLAMA_GPU = re.compile(r'now\.total="' + _NUM + r' (GiB|MiB)" now\.free="' + _NUM + r' (GiB|MiB)"')


def _cuda(line: str, ctx: ParseContext) -> list[tuple[str, int | float | str]] | None:
    if (m := _DEVICE_LINE.search(line)) is not None:
        name = m.group(1).strip()
        return [
            ("device_name", name),
            ("device_total", int(m.group(2)) * _MIB),
            ("device_free", int(m.group(3)) * _MIB),
        ]
    if (m := _USING_DEVICE.search(line)) is not None:
        return [("device_free", int(m.group(1)) * _MIB)]
    if (m := _VLLM_FREE.search(line)) is not None:
        free, total = _bytes(m.group(1), m.group(3)), _bytes(m.group(2), m.group(3))
        return [("device_free", free), ("device_total", total)] if free is not None and total is not None else None
    if "updating cuda memory data" in line and (m := _OLLAMA_GPU.search(line)) is not None:
        total, free = _bytes(m.group(1), m.group(2)), _bytes(m.group(3), m.group(4))
        return [("device_total", total), ("device_free", free)] if free is not None and total is not None else None
    if (m := _CUDA_INFO.search(line)) is not None:
        free = _bytes(m.group(1), (m.group(2) or "").replace("bytes", "b"))
        total = _bytes(m.group(3), (m.group(4) or "").replace("bytes", "b"))
        if free is not None and total is not None and free <= total:
            return [("device_free", free), ("device_total", total)]
    if (m := _TUPLE.search(line)) is not None and ("mem_get_info" in line or line.lstrip().startswith("(")):
        free, total = int(m.group(1)), int(m.group(2))
        if free <= total <= _MAX_BYTES:  # torch.cuda.mem_get_info() -> (free, total) in bytes
            return [("device_free", free), ("device_total", total)]
    return None


# --- the platform --------------------------------------------------------------------------------------

_NV_TEGRA = re.compile(r"#\s*R(\d{2}) \(release\), REVISION: (\d{1,2})\.(\d{1,2})")
_L4T = re.compile(
    r"\b(?:L4T|Jetson Linux)\b[^\d\n]{0,20}?R?(\d{2})\.(\d{1,2})(?:\.(\d{1,2}))?\b|\bnvidia-l4t-core\s+(\d{2})\.(\d{1,2})\.(\d{1,2})"
)
_JETPACK = re.compile(r"\bJetPack\s*:?\s*(\d)\.(\d{1,2})(?:\.(\d{1,2}))?\b", re.IGNORECASE)


def _platform(line: str, ctx: ParseContext) -> list[tuple[str, int | float | str]] | None:
    out: list[tuple[str, int | float | str]] = []
    if (m := _NV_TEGRA.search(line)) is not None:
        out.append(("l4t", f"{m.group(1)}.{m.group(2)}.{m.group(3)}"))
    elif (m := _L4T.search(line)) is not None:
        parts = [p for p in m.groups() if p is not None]
        out.append(("l4t", ".".join(parts)))
    if (m := _JETPACK.search(line)) is not None:
        out.append(("jetpack", ".".join(p for p in m.groups() if p is not None)))
    return out or None


# --- a person's own words ------------------------------------------------------------------------------

_PERSON_KEYS = (
    ("swap", r"swap(?: used)?"),
    ("mem_available", r"(?:mem)?available(?: for gpu)?|avail"),
    ("cached", r"buff(?:er)?s?/cache|cache[sd]?"),
    ("mem_free", r"(?:mem)?free"),
    ("mem_total", r"total(?: ram)?|(?:mem)?total|ram total"),
)
_QTY = r"~?\s*" + _NUM + r"\s*([KMGT]i?B?)\b"
_PERSON_PAIR = re.compile(r"\bswap\b[^0-9\n]{0,12}" + _QTY + r"\s*(?:/|of)\s*" + _QTY, re.IGNORECASE)
_PERSON = re.compile(
    r"(?<![\w.])(" + "|".join(p for _, p in _PERSON_KEYS) + r")\s*(?:[:=]|\bis\b)?\s*" + _QTY, re.IGNORECASE
)


def _person(line: str, ctx: ParseContext) -> list[tuple[str, int | float | str]] | None:
    out: list[tuple[str, int | float | str]] = []
    if (m := _PERSON_PAIR.search(line)) is not None:  # "Swap 1.9GB / 14GB": used of total
        used, total = _bytes(m.group(1), m.group(2)), _bytes(m.group(3), m.group(4))
        if used is not None and total is not None and used <= total:
            out += [("swap_total", total), ("swap_free", total - used)]
            line = line[: m.start()] + line[m.end() :]
    for key_text, number, unit in _PERSON.findall(line):
        value = _bytes(number, unit)
        key = next(name for name, pattern in _PERSON_KEYS if re.fullmatch(pattern, key_text, re.IGNORECASE))
        if value is None or key == "swap":  # a lone swap figure: used or total, nobody can tell
            continue
        out.append((key, value))
    return out or None


Parser = Callable[[str, ParseContext], "list[tuple[str, int | float | str]] | None"]
FORMATS: tuple[tuple[str, Parser], ...] = (
    ("tegrastats", _tegrastats),
    ("meminfo", _meminfo),
    ("free", _free),
    ("psi", _psi),
    ("cuda", _cuda),
    ("platform", _platform),
    ("jtop", jtop_line),
    ("nvmap_clients", nvmap_clients_line),
    ("jetsam", jetsam_line),
    ("os_proc", os_proc_line),
    ("android", android_line),
    ("person", _person),
)


def parse_line(line: str, line_no: int, ctx: ParseContext) -> list[Figure] | None:
    """The figures of one line (``[]``: recognised, nothing to take), or ``None`` if no format
    knows it. Never raises; reads at most ``_MAX_LINE_CHARS`` characters of the line."""
    text = line[:_MAX_LINE_CHARS].rstrip("\r\n")
    if not text.strip():
        return None
    for name, parser in FORMATS:
        try:
            found = parser(text, ctx)
        except (ValueError, OverflowError):  # float('1e999')-like edge a pattern let through
            continue
        if found is not None:
            return [Figure(field, value, name, line_no, text.strip()) for field, value in found]
    return None
