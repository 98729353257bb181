"""The command line behaves like a Unix tool: real subprocesses, real pipes, real files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from memwarden.cli import COMMANDS
from memwarden.trace.io import save
from memwarden.trace.model import TraceBuilder
from test_report import vlm_trace

SNAPSHOT = str(Path(__file__).parent / "fixtures" / "small_snapshot.pickle")


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save(vlm_trace(module_prefix="model."), tmp_path_factory.mktemp("unix") / "run.mwtrace"))


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run the CLI with stdout a pipe whose reader is already gone (`| head` that has exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # before the child starts: its first write to stdout meets a closed pipe, always
    try:
        return subprocess.run(
            [sys.executable, "-m", "memwarden.cli", *args], stdout=write_end, stderr=subprocess.PIPE, timeout=300
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("command", [["summary", "--json"], ["plan", "--json"], ["devices", "--json"]])
def test_closed_pipe_ends_quietly(trace_file: str, command: list[str]) -> None:
    args = [*command, trace_file] if command[0] != "devices" else command
    proc = _run_into_closed_pipe(*args)
    assert proc.returncode in (0, 141), proc.stderr
    assert proc.stderr == b"", proc.stderr  # no "error: Broken pipe", no "Exception ignored"


def test_dash_writes_the_report_to_stdout(trace_file: str) -> None:
    proc = run_cli("report", trace_file, "-o", "-")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.lstrip().lower().startswith("<!doctype html")
    assert proc.stdout.rstrip().endswith("</html>")
    assert proc.stderr.strip() == "wrote stdout"


def test_dash_writes_chrome_json_to_stdout(trace_file: str) -> None:
    proc = run_cli("export", trace_file, "--format", "chrome", "-o", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)  # only the document on stdout
    assert proc.stderr.startswith("wrote stdout")


def test_trace_refuses_a_directory_output_before_the_script_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "job.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = run_cli("trace", "-o", str(out_dir), str(script))
    assert proc.returncode == 2
    assert not marker.exists(), "the script ran although its trace could not be written"
    assert "-o" in proc.stderr and "directory" in proc.stderr
    assert ".partial" not in proc.stderr and "Traceback" not in proc.stderr


def test_trace_refuses_stdout(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("print('hello')\n")
    proc = run_cli("trace", "-o", "-", str(script))
    assert proc.returncode == 2
    assert "hello" not in proc.stdout
    assert "stdout" in proc.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_output_is_refused_and_left_alone(tmp_path: Path, trace_file: str) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    proc = run_cli("report", trace_file, "-o", str(fifo))
    assert proc.returncode == 2
    assert "not a regular file" in proc.stderr
    assert fifo.is_fifo()


def test_a_device_output_is_refused() -> None:
    # In-process on purpose: a writer that ignored this would replace /dev/null itself when run as root.
    from memwarden.errors import InputError
    from memwarden.trace.io import atomic_write, check_output

    with pytest.raises(InputError, match="not a regular file"):
        check_output(os.devnull)
    with pytest.raises(InputError, match="not a regular file"):
        atomic_write(os.devnull, b"x")
    assert Path(os.devnull).is_char_device()


def test_a_symlink_output_is_written_through(tmp_path: Path, trace_file: str) -> None:
    target = tmp_path / "real.html"
    link = tmp_path / "link.html"
    link.symlink_to(target.name)
    proc = run_cli("report", trace_file, "-o", str(link))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink(), "the link was replaced by a file"
    assert target.is_file() and "<html" in target.read_text().lower()


def test_mistyped_flag_gets_the_subcommand_usage_and_a_suggestion(trace_file: str) -> None:
    proc = run_cli("summary", "--jsn", trace_file)
    assert proc.returncode == 2
    assert "usage: memwarden summary" in proc.stderr
    assert "did you mean --json?" in proc.stderr


def test_trace_without_a_script_says_what_to_give() -> None:
    proc = run_cli("trace")
    assert proc.returncode == 2
    assert "required: script, args" not in proc.stderr
    assert "give the Python script to run" in proc.stderr and "memwarden trace -o" in proc.stderr


def test_trace_of_a_directory_says_it_is_one(tmp_path: Path) -> None:
    proc = run_cli("trace", str(tmp_path))
    assert proc.returncode == 2
    assert "is a directory" in proc.stderr and "no such script" not in proc.stderr


def test_success_lines_have_one_wording(tmp_path: Path, trace_file: str) -> None:
    runs = {
        "report": ["report", trace_file, "-o", str(tmp_path / "r.html")],
        "export": ["export", trace_file, "--format", "chrome", "-o", str(tmp_path / "e.json")],
        "diagnose": ["diagnose", trace_file, "--html", str(tmp_path / "d.html")],
        "replay": ["replay", trace_file, "--heatmap", str(tmp_path / "h.png")],
    }
    for name, args in runs.items():
        proc = run_cli(*args)
        assert proc.returncode == 0, (name, proc.stderr)
        lines = [line for line in proc.stdout.splitlines() if str(tmp_path) in line]
        assert lines and all(line.startswith("wrote ") for line in lines), (name, proc.stdout)


def test_estimate_names_its_device_profile_flag_as_the_others_do() -> None:
    assert "--device-profile" in run_cli("estimate", "--help").stdout
    assert "--device-profile" in run_cli("telemetry", "--help").stdout
    new = run_cli("estimate", "llava", "--device-profile", "no-such-board")
    old = run_cli("estimate", "llava", "--device", "no-such-board")
    assert new.returncode == old.returncode == 2
    assert "no-such-board" in new.stderr and "deprecated" not in new.stderr
    assert "--device is deprecated here; use --device-profile" in old.stderr  # still accepted, with a warning


@pytest.mark.parametrize(
    ("args", "flag", "api_name"),
    [
        (["--new-tokens", "0"], "--new-tokens", "new_tokens"),
        (["--audio-seconds", "-1"], "--audio-seconds", "audio_seconds"),
    ],
)
def test_estimate_errors_name_flags(args: list[str], flag: str, api_name: str) -> None:
    proc = run_cli("estimate", "llava", *args, "--no-suggest")
    assert proc.returncode == 2
    assert flag in proc.stderr and not re.search(rf"(?<![-\w]){api_name}\b", proc.stderr), proc.stderr


def test_every_subcommand_help_has_a_description_and_an_example() -> None:
    for command in (name.replace("_", "-") for name in COMMANDS):
        proc = run_cli(command, "--help")
        assert proc.returncode == 0, command
        usage, _, rest = proc.stdout.partition("\n\n")
        description = rest.split("\n\n", 1)[0]
        assert description.strip() and not description.startswith(("positional", "options")), command
        assert re.search(rf"example:\n  memwarden {command}\b", proc.stdout), command


def test_inject_help_names_every_field() -> None:
    out = " ".join(run_cli("stress", "--help").stdout.split())
    for field in ("size=", "period=", "hold=", "at=", "to=", "for=", "temp="):
        assert field in out, field


def test_replay_oom_names_time_size_module_op_category(trace_file: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memwarden.cli", "replay", trace_file, "--limit", "20MiB"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if "out of memory" in line)
    match = re.search(r"at ([\d.]+ (?:s|ms|µs)): ([\d.]+ [KMG]?i?B) for (\S+) \(([\w:]+), (\w+)\)", line)
    assert match, line
    time, size, module, op, category = match.groups()
    assert (
        module.startswith("model.")
        and op.startswith("aten::")
        and category in {"weight", "activation", "temporary", "kv_cache"}
    )


def test_summary_of_a_trace_without_events(tmp_path: Path) -> None:
    path = save(TraceBuilder().build(), tmp_path / "empty.mwtrace")
    proc = run_cli("summary", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "No allocations were recorded" in proc.stdout
    assert "share" not in proc.stdout and "━" not in proc.stdout  # no empty tables
    assert json.loads(run_cli("summary", "--json", str(path)).stdout)["events"] == 0
