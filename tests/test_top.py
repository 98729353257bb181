"""`memwarden top URL`: a governed session's metrics endpoint read over 127.0.0.1, printed once,
and driven live in a real terminal (tmux) while the session serves requests.

The live test waits for what the screen must show (no sleeps sized to a machine): the count of
requests before serving, then after; a deadline only bounds a failure."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest

from conftest import ServedSession
from memwarden.cli import main


def test_once_shows_the_session_in_80_columns(
    served_session: ServedSession, capsys: pytest.CaptureFixture[str]
) -> None:
    session, metrics = served_session.session, served_session.metrics
    served_session.serve()
    stats = session.stats()
    assert main(["top", f"127.0.0.1:{metrics.port}", "--once"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert re.search(r"^budget\s+1\.0 GiB", out, re.M)
    assert re.search(rf"^requests\s+{len(stats['requests'])}\b", out, re.M)
    used = stats["kv_blocks"] - stats["kv_free_blocks"]
    assert re.search(rf"^KV blocks used\s+{used}/{stats['kv_blocks']}\b", out, re.M)
    assert "decisions           admit" in out


def test_unreachable_or_bad_urls_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on: bound, never listened
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert main(["top", f"127.0.0.1:{port}", "--once"]) == 2
    assert "cannot read metrics" in capsys.readouterr().err
    assert main(["top", "ftp://x/metrics", "--once"]) == 2
    assert main(["top", "127.0.0.1:1", "--interval", "0", "--once"]) == 2


def _pane(socket_name: str) -> str:
    done = subprocess.run(
        ["tmux", "-L", socket_name, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True
    )
    return done.stdout


def _wait_for(socket_name: str, pattern: str, deadline_s: float = 120) -> str:
    end = time.monotonic() + deadline_s
    screen = ""
    while time.monotonic() < end:
        screen = _pane(socket_name)
        if re.search(pattern, screen, re.M):
            return screen
        time.sleep(0.1)
    raise AssertionError(f"the screen never showed {pattern!r}; last screen:\n{screen}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux for a real terminal; not installed here")
def test_live_view_in_a_real_terminal_follows_the_session(served_session: ServedSession) -> None:
    session, metrics = served_session.session, served_session.metrics
    socket_name = f"memwarden-test-{os.getpid()}"
    command = f"{sys.executable} -m memwarden.cli top {metrics.url} --interval 0.2"
    subprocess.run(
        ["tmux", "-L", socket_name, "new-session", "-d", "-s", "top", "-x", "80", "-y", "30", command], check=True
    )
    try:
        before = len(session.stats()["requests"])
        first = _wait_for(socket_name, rf"^requests\s+{before}\b")
        served_session.serve()
        served_session.serve()
        second = _wait_for(socket_name, rf"^requests\s+{before + 2}\b")
        assert first != second
        assert re.search(r"^decisions\s+admit " + str(before + 2), second, re.M)
        assert max(len(line) for line in second.splitlines()) <= 80
    finally:
        subprocess.run(["tmux", "-L", socket_name, "kill-server"], capture_output=True)


SCRIPT = """
import os, sys, time
import torch

held = []
for step in range(3):
    held.append(torch.ones(256 * 1024 * (step + 1)))  # 1, 2 then 3 MiB more
    while not os.path.exists(f"{sys.argv[1]}.{step}"):  # the test says when to go on
        time.sleep(0.05)
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux for a real terminal; not installed here")
def test_trace_live_shows_the_figures_change_as_the_script_runs(tmp_path: Any) -> None:
    script = tmp_path / "grow.py"
    script.write_text(SCRIPT)
    go = tmp_path / "go"
    socket_name = f"memwarden-live-{os.getpid()}"
    out = tmp_path / "run.mwtrace"
    command = f"cd {tmp_path} && {sys.executable} -m memwarden.cli trace --live -o {out} {script} {go}; sleep 600"
    subprocess.run(
        ["tmux", "-L", socket_name, "new-session", "-d", "-s", "top", "-x", "80", "-y", "30", command], check=True
    )
    try:
        screens = []
        for step, live in enumerate(("1.0 MiB", "3.0 MiB", "6.0 MiB")):
            screens.append(_wait_for(socket_name, rf"^live {re.escape(live)} "))
            (tmp_path / f"go.{step}").touch()
        assert re.search(r"^by category\s*\n  \w+\s+6\.0 MiB", screens[-1], re.M)  # all alive, one category
        assert re.search(r"^\s+6\.0 MiB  .*grow\.py:7:<module>", screens[-1], re.M)  # the line that allocated
        assert max(len(line) for s in screens for line in s.splitlines()) <= 80
        final = _wait_for(socket_name, r"grow\.py completed\.")
        assert "(finished)" in final
    finally:
        subprocess.run(["tmux", "-L", socket_name, "kill-server"], capture_output=True)
