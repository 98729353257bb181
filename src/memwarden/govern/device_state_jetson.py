"""Jetson memory signals beyond tegrastats: jtop's memory dict and NvMap's per-process clients.

Each parser has the signature of ``device_state_lines``' parsers: one line (and the paste's
:class:`~memwarden.govern.device_state_context.ParseContext`) in, ``[(field, value), ...]`` out, or
``None`` when the line is not of its format. Nothing raises on a line.

- **jtop** (jetson-stats): ``jetson.memory`` printed as a Python dict or as JSON,
  ``{'RAM': {'tot': .., 'used': .., 'free': .., 'buffers': .., 'cached': .., 'shared': .., 'lfb': ..},
  'SWAP': {'tot': .., 'used': .., ...}}``. Units are KiB (jtop reads ``/proc/meminfo``); ``shared``
  is ``NvMapMemUsed`` (what GPU clients hold); ``lfb`` is the count of free blocks of the buddy
  allocator's largest order, which jtop labels "In 4MB" (rbonghi/jetson_stats, jtop/core/memory.py,
  ``MemoryService.get_status``). jtop gives no MemAvailable: ``free`` + ``buffers`` + ``cached`` is
  the upper estimate the model already uses for a meminfo without that line.
- **NvMap clients** (``/sys/kernel/debug/nvmap/iovmm/clients``, root only; absent on Jetson Thor):
  a ``CLIENT PROCESS PID SIZE`` header, one ``user  NAME  PID  SIZE{K,M,G}`` row per process, and a
  ``total  SIZE`` row (htop-dev/htop linux/NvidiaJetson.c; gimbal-ai/gimbal src/common/system/nvmap.cc).
  Rows are read only after the header, so a stray ``user x 1 2K`` elsewhere is not one.
"""

from __future__ import annotations

import re

from memwarden.govern.device_state_context import ParseContext

__all__ = ["jtop_line", "nvmap_clients_line"]

_KIB = 1 << 10
_MAX_KIB = 1 << 52  # 4 EiB in KiB: a larger figure is not memory
_LFB_BLOCK_BYTES = 4 << 20  # jtop's own label for its lfb count ("In 4MB")

Found = list[tuple[str, int | float | str]]

_JTOP_SECTION = re.compile(r"""['"](RAM|SWAP)['"]\s*:\s*\{([^{}]{0,600})""")
_JTOP_PAIR = re.compile(r"""['"](tot|used|free|buffers|cached|shared|lfb)['"]\s*:\s*(\d{1,16})\b""")


def jtop_line(line: str, ctx: ParseContext) -> Found | None:
    sections = {name: dict(_JTOP_PAIR.findall(body)) for name, body in _JTOP_SECTION.findall(line)}
    ram = sections.get("RAM", {})
    if "tot" not in ram or "free" not in ram:
        return None
    kib = {k: int(v) for k, v in ram.items()}
    if any(v > _MAX_KIB for v in kib.values()) or kib["free"] > kib["tot"]:
        return None
    out: Found = [("mem_total", kib["tot"] * _KIB), ("mem_free", kib["free"] * _KIB)]
    if "cached" in kib:  # jtop's cached is Cached + SReclaimable; buffers are reclaimable too
        out.append(("cached", (kib["cached"] + kib.get("buffers", 0)) * _KIB))
    if kib.get("shared"):  # NvMapMemUsed; jtop puts the total there when the kernel says 0
        out.append(("nvmap_used", kib["shared"] * _KIB))
    if "lfb" in kib:
        out += [("lfb_count", kib["lfb"]), ("lfb_block", _LFB_BLOCK_BYTES)]
    swap = {k: int(v) for k, v in sections.get("SWAP", {}).items()}
    if "tot" in swap and "used" in swap and swap["used"] <= swap["tot"] <= _MAX_KIB:
        out += [("swap_total", swap["tot"] * _KIB), ("swap_free", (swap["tot"] - swap["used"]) * _KIB)]
    return out


_NVMAP_HEAD = re.compile(r"^\s*CLIENT\s+PROCESS\s+PID\s+(?:PSS\s+)?SIZE\s*$")
_NVMAP_ROW = re.compile(r"^\s*(user|kernel)\s+(\S{1,64})\s+(\d{1,10})\s+(?:\d{1,15}[KMG]\s+)?(\d{1,15})([KMG])\s*$")
_NVMAP_TOTAL = re.compile(r"^\s*total\s+(?:\d{1,15}[KMG]\s+)?(\d{1,15})([KMG])\s*$")
_NVMAP_UNIT = {"K": _KIB, "M": 1 << 20, "G": 1 << 30}


def nvmap_clients_line(line: str, ctx: ParseContext) -> Found | None:
    if _NVMAP_HEAD.match(line):
        ctx.nvmap_table = True
        ctx.nvmap_top = None
        return []
    if not ctx.nvmap_table:
        return None
    if (m := _NVMAP_ROW.match(line)) is not None:
        size = int(m.group(4)) * _NVMAP_UNIT[m.group(5)]
        if size > _MAX_KIB * _KIB:
            return None
        if ctx.nvmap_top is None or size > ctx.nvmap_top[1]:
            ctx.nvmap_top = (f"{m.group(2)} (pid {m.group(3)})", size)
        return []  # a row: its figure is in the total; the largest is named with it
    if (m := _NVMAP_TOTAL.match(line)) is not None:
        ctx.nvmap_table = False
        total = int(m.group(1)) * _NVMAP_UNIT[m.group(2)]
        out: Found = [("nvmap_clients_total", total)]
        if ctx.nvmap_top is not None:
            out += [("nvmap_top_client", ctx.nvmap_top[0]), ("nvmap_top_client_bytes", ctx.nvmap_top[1])]
        return out
    ctx.nvmap_table = False  # the table ended without its total line
    return None
