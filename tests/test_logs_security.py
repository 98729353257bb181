"""Hostile telemetry logs, align-check logs and pytest-plugin options: each is answered with one
error line and exit status 2 (a failed test for a bad marker), within bounded time and memory;
never a traceback, never a hang. Real files, real FIFOs (os.mkfifo), real subprocesses; a
subprocess timeout is only a guard against a hang, never a measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memwarden.align import StreamAligner
from memwarden.errors import InputError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_fuzz_logs  # noqa: E402

pytest_plugins = ["pytester"]
GUARD_S = 120  # a hang guard only: a correct run ends in a few seconds


def run_limited(*args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """``memwarden ARGS`` in a subprocess; its result and its peak RSS in MiB (wait4's rusage)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "memwarden.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"memwarden {' '.join(args)} hung") from None
    _, _, usage = os.wait4(proc.pid, 0) if proc.returncode is None else (0, 0, None)
    rss_mib = int(usage.ru_maxrss / 1024) if usage is not None else 0
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), rss_mib


def one_error_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memwarden.cli", *args], capture_output=True, text=True, timeout=GUARD_S
    )


# -- telemetry logs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, words",
    [
        ('{"t": 0, "mem_total_bytes": 1' + "0" * 400 + "}\n", ["401-digit", "line 1"]),
        ('{"t": 1' + "0" * 400 + "}\n", ["digit"]),
        ("RAM 100/200MB VDD_IN 1" + "0" * 400 + "mW/1mW\n", ["rail VDD_IN", "out of range"]),
        ("33-05-2024 10:00:06 RAM 100/200MB\n", ["bad timestamp"]),  # found by bench_fuzz_logs.py
    ],
)
def test_telemetry_huge_numbers_are_one_line(tmp_path: Path, content: str, words: list[str]) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text(content)
    one_error_line(cli("telemetry", "--replay", str(log)), *words)


def test_telemetry_interval_inf_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"t": 0, "temp_c": 40}\n')
    one_error_line(cli("telemetry", "--replay", str(log), "--interval", "inf"), "--interval")
    one_error_line(cli("telemetry", "--count", "2", "--interval", "1e400"), "--interval")


@pytest.mark.parametrize("command", [["telemetry", "--replay"], ["align-check"]])
def test_a_fifo_or_dev_zero_is_refused_not_read(tmp_path: Path, command: list[str]) -> None:
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)  # nobody ever writes: a reader that opens it blocking hangs
    one_error_line(cli(*command, str(fifo)), "not a regular file")
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    one_error_line(cli(*command, str(zero)), "not a regular file")


def test_telemetry_log_of_blank_lines_is_cut_at_the_line_limit(tmp_path: Path) -> None:
    from memwarden.govern.telemetry_log import MAX_LINES, load_log

    log = tmp_path / "blank.jsonl"
    log.write_bytes(b"\n" * (MAX_LINES + 10))
    with pytest.raises(InputError, match="lines"):
        load_log(log)


def test_telemetry_markup_in_a_log_name_is_shown_not_applied(tmp_path: Path) -> None:
    (tmp_path / "[red]x[").mkdir()
    log = tmp_path / "[red]x[" / "bogus].jsonl"  # the path holds "[/bogus]": a closing tag never opened
    log.write_text('{"t": 0, "temp_c": 40}\n')
    result = cli("telemetry", "--replay", str(log))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


# -- align-check logs and the aligner -------------------------------------------------------


def align_log(path: Path, *extra: str, header: dict[str, object] | None = None) -> Path:
    lines = [json.dumps(header or {"type": "header", "audio_rate": 16000, "video_fps": 25})]
    for i in range(100):
        lines.append(json.dumps({"type": "audio", "t_s": i * 0.04 + 0.01, "samples": 640}))
        lines.append(json.dumps({"type": "video", "t_s": i * 0.04}))
    path.write_text("\n".join([*lines, *extra]) + "\n")
    return path


@pytest.mark.parametrize(
    "extra, words",
    [
        ('{"type": "video", "t_s": 1000000}', ["frame slots", "gaps"]),
        ('{"type": "audio", "t_s": 100000, "samples": 640}', ["gaps"]),
        ('{"type": "audio", "t_s": 1' + "0" * 400 + ', "samples": 640}', ["401-digit"]),
        ('{"type": "audio", "t_s": 4.1, "samples": 10000000}', ["samples"]),
    ],
)
def test_align_check_huge_jumps_are_refused_before_allocating(tmp_path: Path, extra: str, words: list[str]) -> None:
    result, rss_mib = run_limited("align-check", str(align_log(tmp_path / "log.jsonl", extra)))
    one_error_line(result, *words)
    assert rss_mib < 1024, rss_mib  # was 4 GB (10^6 s of frame slots) and 6 GiB (10^5 s of silence)


@pytest.mark.parametrize(
    "header",
    [
        {"type": "header", "audio_rate": 16000, "video_fps": 1e-300},
        {"type": "header", "audio_rate": 1e999, "video_fps": 25},
        {"type": "header", "audio_rate": 16000, "video_fps": 25, "audio_per_frame": 10**400},
        {"type": "header", "audio_rate": 16000, "video_fps": 25, "audio_per_frame": 1000000},
    ],
)
def test_align_check_header_out_of_range_is_one_line(tmp_path: Path, header: dict[str, object]) -> None:
    path = tmp_path / "log.jsonl"
    align_log(path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([json.dumps(header, allow_nan=True).replace("Infinity", "1e999"), *lines[1:]]) + "\n")
    result, rss_mib = run_limited("align-check", str(path))
    one_error_line(result)
    assert rss_mib < 1024


def test_aligner_refuses_a_gap_over_max_gap_s_before_filling_it() -> None:
    aligner = StreamAligner(16000, 25)
    for i in range(60):
        aligner.push_audio(i * 0.02, np.zeros(320, np.float32))
        aligner.push_frame(i * 0.04)
    with pytest.raises(InputError, match="max_gap_s"):
        aligner.push_audio(1e5, np.zeros(320, np.float32))  # would be 1.6e9 samples of silence
    with pytest.raises(InputError, match="max_gap_s"):
        aligner.push_frame(1e6)  # would be 2.5e7 frame slots
    with pytest.raises(InputError, match="finite"):
        aligner.push_frame(10**400)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        StreamAligner(16000, float("inf"))
    with pytest.raises(InputError):
        StreamAligner(16000, 25, audio_per_frame=10**400)
    assert aligner.counters.audio_gap_samples_filled == 0 and aligner.counters.frames_filled == 0


# -- the pytest plugin ----------------------------------------------------------------------

MARKED = """
import pytest
from fractions import Fraction

@pytest.mark.memwarden(peak=Fraction(10**400))
def test_huge_limit():
    pass

def test_plain():
    pass
"""


def test_plugin_marker_that_overflows_fails_that_test_in_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=GUARD_S)
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "OverflowError" not in text and "out of range" in text


def test_plugin_traces_option_naming_a_file_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    taken = pytester.path / "traces"
    taken.write_text("a file, not a directory")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--memwarden-traces={taken}", timeout=GUARD_S)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "not a directory" in result.stderr.str() and "FileExistsError" not in result.stderr.str()


# -- the structured fuzz campaign, a bounded budget -----------------------------------------


@pytest.mark.parametrize("target", sorted(bench_fuzz_logs.TARGETS))
def test_fuzz_campaign_has_no_traceback_hang_or_injection(tmp_path: Path, target: str) -> None:
    result = bench_fuzz_logs.run(target, 300 if target != "tegrastats" else 150, seed=1, tmp=tmp_path, hang_s=60)
    assert result["tracebacks"] == 0 and result["hangs"] == 0 and result["injections"] == 0, result["examples"]
    assert result["clear_errors"] > 0 and result["accepted"] > 0  # the mutations reach both outcomes
