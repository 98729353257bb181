"""Issue 46, round two: the signals Jetsons and phones give (jtop, NvMap clients, CMA, jetsam,
os_proc_available_memory, dumpsys meminfo, lmkd, trim levels), each parsed from public samples
(tests/fixtures/device_state/signals/README.md), and buffer-by-buffer judging against lfb."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from memwarden.govern.device_state import judge, obtainable, read_state
from memwarden.govern.device_state_context import ParseContext
from memwarden.govern.device_state_lines import parse_line

SIGNALS = Path(__file__).parent / "fixtures" / "device_state" / "signals"
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def _state(name: str):
    read = read_state((SIGNALS / name).read_text().splitlines())
    assert read.samples, name
    return read, read.samples[-1]


def test_every_sample_names_its_public_source() -> None:
    readme = (SIGNALS / "README.md").read_text()
    for path in SIGNALS.glob("*.txt"):
        head = path.read_text().splitlines()[0]
        assert head.startswith("## source:") and "http" in path.read_text().split("\n##   ")[0] + readme
        assert path.name in readme


def test_jtop_memory_dict() -> None:
    read, state = _state("jtop_memory_orin.txt")
    assert read.by_format == {"jtop": 1} and state.integrated is True
    assert state.value("mem_total") == 3688892 * KIB and state.value("nvmap_used") == 36904 * KIB
    assert (state.value("lfb_count"), state.value("lfb_block")) == (28, 4 * MIB)
    ob = obtainable(state, "cuda")  # no MemAvailable in jtop: free + buffers + cached, an upper estimate
    assert ob.bytes == (737636 + 99660 + 1258132) * KIB and "estimate" in ob.basis
    assert obtainable(state, "host").bytes == ob.bytes + 1844424 * KIB  # zram swap helps host memory only


@pytest.mark.parametrize(
    ("name", "total", "top"),
    [
        ("nvmap_clients_htop.txt", 23549320 * KIB, "gpu_burn (pid 7979)"),
        ("nvmap_clients_gimbal.txt", 141896 * KIB, "gem (pid 4481)"),
    ],
)
def test_nvmap_clients_table(name: str, total: int, top: str) -> None:
    text = (SIGNALS / name).read_text() + "MemAvailable: 4194304 kB\n"
    read = read_state(text.splitlines())
    state = read.samples[-1]
    assert read.skipped == 0 and state.integrated is True
    ob = obtainable(state, "cuda")
    comp = ob.components["gpu_clients_hold_nvmap"]
    assert comp.bytes == total and top in comp.note and not comp.counts
    assert ob.bytes == 4 * GIB  # already outside MemAvailable: shown, not subtracted twice


def test_nvmap_rows_outside_the_table_are_not_read() -> None:
    assert parse_line("user  gpu_burn  7979  23525644K", 1, ParseContext()) is None
    read = read_state(["CLIENT PROCESS PID SIZE", "a line that ends the table", "user x 1 5K", "total 5K"])
    assert "nvmap_clients_total" not in read.samples[-1].figures if read.samples else True


def test_cma_free_lowers_what_cuda_gets_on_a_jetson() -> None:
    lines = ["L4T R36.4.4", "MemAvailable: 4194304 kB", "CmaTotal: 524288 kB", "CmaFree: 409600 kB"]
    state = read_state(lines).samples[-1]
    cuda, host = obtainable(state, "cuda"), obtainable(state, "host")
    assert cuda.bytes == (4194304 - 409600) * KIB and "CmaFree" in cuda.basis
    assert cuda.components["cma_free"].counts and "subtracted" in cuda.components["cma_free"].note
    assert host.bytes == 4194304 * KIB  # movable host pages may use CMA
    request = 4000 * MIB  # fits MemAvailable (the naive reading), not what pinned GPU buffers can get
    verdict = judge(state, request, "cuda")
    assert verdict.verdict == "fails" and verdict.naive["request_le_mem_available"] is True


def test_jetsam_per_process_limit_caps_an_iphone() -> None:
    read, state = _state("jetsam_forum_98522.txt")
    assert state.value("jetsam_limit") == 960 * 16384 and state.value("jetsam_killed") == "RebornTunnel"
    ob = obtainable(state, "host")
    comp = ob.components["jetsam_per_process_limit"]
    assert ob.bytes == 960 * 16384 and comp.counts and "assumed 16 KiB" in comp.note and comp.line_no >= 1
    assert judge(state, 20 * MIB, "host").verdict == "fails"  # over the 15 MB extension limit
    assert judge(state, 10 * MIB, "host").verdict == "fits"


def test_jetsam_report_header_gives_page_size_free_pages_and_largest_process() -> None:
    header = (SIGNALS / "jetsam_ios14_header.txt").read_text().splitlines()
    entry = (SIGNALS / "jetsam_forum_98522.txt").read_text().splitlines()
    read = read_state(header + ['  "processes" : ['] + entry)
    state = read.samples[-1]
    assert state.value("jetsam_page_size") == 16384 and state.value("jetsam_largest_process") == "AppStore"
    assert state.value("mem_free") == 5142 * 16384  # memoryPages.free, not another "free"
    assert state.value("jetsam_page_size_assumed") is None
    ob = obtainable(state, "host")
    assert ob.bytes == 960 * 16384  # the limit binds below the system's free pages + nothing else
    assert read.skipped <= 2


def test_os_proc_available_memory_binds_below_the_system_figure() -> None:
    # apps log the API's return value (bytes); the line is ours, its form is the API's (no public paste found)
    state = read_state(["MemAvailable: 4194304 kB", "os_proc_available_memory: 1073741824"]).samples[-1]
    ob = obtainable(state, "host")
    assert ob.bytes == GIB and ob.components["os_proc_available"].counts
    assert read_state(["os_proc_available_memory() = 512 MB"]).samples[-1].value("os_proc_available") == 512 * MIB


def test_dumpsys_meminfo_summary() -> None:
    read, state = _state("dumpsys_meminfo_lost_ram.txt")
    assert read.skipped == 0 and state.value("mem_total") == 2822140 * KIB
    ob = obtainable(state, "host")
    assert ob.bytes == 559338 * KIB and ob.components["android_free_ram"].counts


def test_lmkd_kill_line_is_shown_with_the_victim() -> None:
    lines = (SIGNALS / "lmkd_kill_crdroid_809.txt").read_text().splitlines() + ["MemAvailable: 1048576 kB"]
    state = read_state(lines).samples[-1]
    comp = obtainable(state, "host").components["lmkd_killed"]
    assert comp.bytes == 140528 * KIB and "oom_score_adj 0" in comp.note and "not responding" in comp.note
    assert state.value("lmkd_killed_adj") == 0


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("onTrimMemory level: 15", 15),
        ("Memory level: TRIM_MEMORY_RUNNING_CRITICAL", 15),
        ("I/App: onTrimMemory(80)", 80),
        ("onTrimMemory level: 7", None),
    ],
)
def test_trim_levels(line: str, level: int | None) -> None:
    figures = parse_line(line, 1, ParseContext()) or []
    assert {f.field: f.value for f in figures}.get("trim_level") == level


# --- buffer by buffer against lfb (item 2) -----------------------------------------------------------


def test_largest_buffer_over_the_largest_free_block() -> None:
    state = read_state(["RAM 5528/7620MB (lfb 12x4MB) SWAP 471/3810MB (cached 2MB)"]).samples[-1]
    contiguous = judge(state, 8 * MIB, "contiguous", largest_buffer_bytes=8 * MIB)
    assert contiguous.verdict == "fails"
    assert contiguous.components["does_not_fit_contiguously"].counts
    many_small = judge(state, 40 * MIB, "contiguous", largest_buffer_bytes=4 * MIB)  # 10 buffers of 4 MB, 12 blocks
    assert many_small.verdict == "fits" and "does_not_fit_contiguously" not in many_small.components
    assert judge(state, 60 * MIB, "contiguous", largest_buffer_bytes=4 * MIB).verdict == "fails"  # 15 > 12 blocks
    cuda = judge(state, 1 * GIB, "cuda", largest_buffer_bytes=512 * MIB)  # SMMU-mapped: shown, does not decide
    assert cuda.verdict == "fits" and not cuda.components["does_not_fit_contiguously"].counts


def test_largest_buffer_can_still_come_from_cma() -> None:
    state = read_state(["RAM 5528/7620MB (lfb 1x2MB) SWAP 0/3810MB", "CmaFree: 65536 kB"]).samples[-1]
    assert judge(state, 32 * MIB, "contiguous", largest_buffer_bytes=32 * MIB).verdict == "fits"
    assert judge(state, 80 * MIB, "contiguous", largest_buffer_bytes=80 * MIB).verdict == "fails"


def test_cli_largest_buffer_and_new_formats(tmp_path: Path) -> None:
    state = tmp_path / "tegra.txt"
    state.write_text("RAM 2417/3956MB (lfb 2x4MB) SWAP 0/1978MB (cached 0MB)\n")
    base = ["telemetry", "--replay", str(state), "--request", "16MiB", "--kind", "contiguous", "--json"]
    out = json.loads(run_cli(*base, "--largest-buffer", "16MiB").stdout)
    assert out["verdict"] == "fails" and "does_not_fit_contiguously" in out["components"]
    assert {"verdict", "obtainable_bytes", "components"} <= out.keys()
    bad = run_cli(*base, "--largest-buffer", "1GiB")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "larger than --request" in bad.stderr
    proc = run_cli(
        "telemetry",
        "--replay",
        str(SIGNALS / "jetsam_forum_98522.txt"),
        "--request",
        "20MiB",
        "--kind",
        "host",
        "--json",
    )
    out = json.loads(proc.stdout)
    assert proc.returncode == 1 and out["verdict"] == "fails" and out["obtainable_bytes"] == 960 * 16384


_HOSTILE = [
    '"rpages" : 99999999999999999999999, "reason" : "per-process-limit"',
    "{" * 5000 + "}" * 7000,
    "{'RAM': {'tot': 1, 'free': 99999999999999999}}",
    "CLIENT PROCESS PID SIZE",
    "user x 1 999999999999999G",
    "total 99999999999999G",
    "lowmemorykiller: Kill '" + "x" * 300 + "' (1), uid 1, oom_score_adj 0 to free 1kB rss",
    "Free RAM: -5K",
    "os_proc_available_memory: 1e999",
    '"pageSize" : 0, "memoryPages" : { "free" : 99999999999999 }',
]


def test_hostile_lines_never_raise() -> None:
    read = read_state(_HOSTILE * 3)
    for sample in read.samples:
        for kind in ("cuda", "host", "mmap", "contiguous"):
            ob = obtainable(sample, kind)
            assert ob.bytes is None or 0 <= ob.bytes <= 1 << 62
