"""Terminal output fits 80 columns, and findings read in five seconds: real subprocesses at COLUMNS=80."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from rich.cells import cell_len

from memwarden.report.columns import elide_middle
from memwarden.trace.io import save
from test_report import vlm_trace

PREFIX = "model.multimodal_backbone.language_model."  # long paths, as real VLMs have


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save(vlm_trace(module_prefix=PREFIX), tmp_path_factory.mktemp("term") / "run.mwtrace"))


def at_80(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "memwarden.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.splitlines()
    too_wide = [line for line in lines if cell_len(line.rstrip()) > 80]
    assert not too_wide, too_wide
    return proc.stdout


def test_summary_sites_are_one_line_each_with_paths_elided_in_the_middle(trace_file: str) -> None:
    out = at_80("summary", trace_file)
    sites = out.split("Top allocation sites at peak")[1].splitlines()[3:]  # title rest, header, rule
    rows = [line for line in sites if line.strip()]
    assert rows
    assert all(re.search(r"\d (B|KiB|MiB|GiB)\b", line) for line in rows), rows  # no wrapped continuation lines
    assert any("…" in line for line in rows)
    assert all(line.split()[0].startswith("model.") for line in rows)  # the head of the path is kept


def test_summary_header_keeps_labels_with_their_values(trace_file: str) -> None:
    out = at_80("summary", trace_file)
    for label in ("peak", "weights", "events", "duration"):
        assert re.search(rf"\b{label} \S", out), label  # never "duration" at a line's end, its value below


def test_devices_table_has_no_blank_headers() -> None:
    out = at_80("devices")
    header = next(line for line in out.splitlines() if line.startswith("id"))
    names = [cell.strip() for cell in header.split("┃")]
    assert all(names) and {"id", "total", "usable", "bandwidth"} <= set(names)


def test_one_device_shows_its_name_on_one_line() -> None:
    out = at_80("devices", "jetson-orin-nano-8gb")
    assert "NVIDIA Jetson Orin Nano 8GB" in out


def test_findings_read_in_five_seconds(trace_file: str) -> None:
    out = at_80("diagnose", trace_file)
    blocks = re.split(r"\n(?=\d+\. (?:HIGH|MEDIUM|LOW) )", out)[1:]
    assert blocks, out
    for block in blocks:
        assert re.search(r"the fix saves [\d.]+ \w*B at the peak and [\d.]+ \w*B of allocation", block), block
        fix = block.split("   fix ", 1)[1].split("   at ", 1)[0].split("   evidence", 1)[0]
        assert len(fix.strip().splitlines()) <= 3, fix
        assert "{'" not in block and "[{" not in block  # evidence as a table, not a Python dict


def test_elide_middle_keeps_the_ends() -> None:
    path = "model.language_model.layers.11.self_attn.q_proj"
    for width in range(1, len(path) + 2):
        short = elide_middle(path, width)
        assert cell_len(short) <= width
        if width >= len(path):
            assert short == path
    assert elide_middle(path, 33) == "model.…layers.11.self_attn.q_proj"
    assert elide_middle(path, 32) == "model.…11.self_attn.q_proj"


def test_demo_ends_with_what_to_open_and_three_commands() -> None:
    from rich.console import Console

    from memwarden.commands.demo import what_next

    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115 (closed with the process)
    console.print(what_next("out/report.html", "out/demo.mwtrace"))
    text = console.export_text()
    assert "open out/report.html" in text
    commands = [line.strip() for line in text.splitlines() if line.startswith("  memwarden ")]
    assert len(commands) == 3 and all(cell_len(c) <= 78 for c in commands), commands  # copyable, unwrapped
    assert "examples/scenarios/" in text
