"""Hostile doctor facts and pipeline configs: one error line and exit status 2, or a screen on
which the facts' text is shown, never applied (no escape sequence, no rich link). Real files,
real FIFOs, real subprocesses; timeouts only guard against hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"
GUARD_S = 120


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color", "FORCE_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "memwarden.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env=env,
    )


def one_error_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout[-500:], result.stderr)
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def facts_with(tmp_path: Path, text: str | None = None, **sections: object) -> Path:
    facts = json.loads((FIXTURES / "clean.json").read_text())
    facts.update(sections)
    path = tmp_path / "facts.json"
    path.write_text(text if text is not None else json.dumps(facts))
    return path


@pytest.mark.parametrize(
    "raw, words",
    [
        ('"total_bytes": 1' + "0" * 400, ["401-digit"]),
        ('"total_bytes": 1e999', ["finite"]),
        ('"total_bytes": Infinity', ["finite"]),
        ('"total_bytes": ' + "[" * 100000 + "]" * 100000, ["deep"]),
        ('"total_bytes": ' + "[" * 900 + "]" * 900, ["deep"]),
    ],
)
def test_huge_numbers_and_deep_json_are_one_line(tmp_path: Path, raw: str, words: list[str]) -> None:
    text = '{"schema": "memwarden-doctor-facts/1", "memory": {' + raw + "}}"
    one_error_line(doctor("--facts", str(facts_with(tmp_path, text))), *words)


def test_probe_timeout_inf_is_one_line() -> None:
    one_error_line(doctor("--no-probe", "--probe-timeout", "inf"), "--probe-timeout")
    one_error_line(doctor("--no-probe", "--probe-timeout", "1e400"), "--probe-timeout")


def test_escape_sequences_markup_and_surrogates_are_shown_not_applied(tmp_path: Path) -> None:
    hostile = "\x1b]0;pwned\x07\x1b[2J[link=file:///etc/passwd]click[/link] \ud800 [/bogus]"
    path = facts_with(tmp_path, platform={"python": hostile})
    path.write_text(json.dumps(json.loads(path.read_text())))  # ensure_ascii: "\ud800" stays an escape
    result = doctor("--facts", str(path))
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    assert "\x1b]0;" not in result.stdout and "\x1b[2J" not in result.stdout  # no title, no clear-screen
    assert "\x1b]8;" not in result.stdout  # no hyperlink (OSC 8) anywhere
    assert "[link=file:///etc/passwd]" in result.stdout  # the text itself, visible
    assert "\\x1b]0;pwned" in result.stdout


def test_json_mode_with_a_lone_surrogate_is_valid_json(tmp_path: Path) -> None:
    result = doctor("--facts", str(facts_with(tmp_path, platform={"python": "\ud800"})), "--json")
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(result.stdout)["facts"]["platform"]["python"] == "\ufffd"


@pytest.mark.parametrize("option", ["--facts", "--pipeline"])
def test_a_fifo_or_dev_zero_is_refused_not_read(tmp_path: Path, option: str) -> None:
    fifo = tmp_path / "input.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    base = [] if option == "--facts" else ["--facts", str(FIXTURES / "clean.json")]
    one_error_line(doctor(*base, option, str(fifo)), "not a regular file")
    one_error_line(doctor(*base, option, str(zero)), "not a regular file")


def test_pipeline_huge_rate_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "graph.pbtxt"
    config.write_text("sample_rate: 1" + "0" * 400 + "\n")
    one_error_line(doctor("--facts", str(FIXTURES / "clean.json"), "--pipeline", str(config)), "out of range")


def test_a_fifo_planted_in_a_cache_directory_does_not_hang_collect(tmp_path: Path) -> None:
    cache = tmp_path / "trt_cache"
    cache.mkdir()
    (cache / "model.engine").write_bytes(b"\0")
    os.mkfifo(cache / "built_by.json")  # read by the cache source: must be skipped, not opened blocking
    result = doctor("--collect", "--no-probe", "--cache-dir", str(cache))
    assert result.returncode == 0, result.stderr
    caches = json.loads(result.stdout)["caches"]
    assert [c["kind"] for c in caches] == ["tensorrt"] and caches[0]["built_by"] == {}
