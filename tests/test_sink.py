"""issue 41: ``memwarden trace --sink`` and ``memwarden collect``: the trace outlives the container.

A container kill is played by SIGKILL to the whole process group of ``memwarden trace`` (the
supervisor and the script together); the collector runs outside that group. No test depends on
timing: the kill waits on a file the script writes after its flush and then on the collector's
file holding the flushed bytes (a condition, polled under a generous bound).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import memwarden
from memwarden.record.live.collector import Collector
from memwarden.record.live.wire import SINK_MAGIC, SinkAddress
from memwarden.trace.format import FORMAT_MAGIC
from memwarden.trace.stream import STREAM_MAGIC

MIB = 1 << 20
KEPT = 24 * MIB

SLEEPER = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import memwarden

    kept = [torch.ones(4 << 20, dtype=torch.uint8) for _ in range(6)]
    assert memwarden.flush()
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    while True:  # until the container is killed
        time.sleep(1)
    """
)
QUICK = "import torch\nkept = [torch.ones(1 << 20) for _ in range(4)]\n"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "memwarden.cli", *args]


def _wait(condition: object, what: str, tries: int = 2400) -> None:
    """Poll ``condition`` every 50 ms, at most ``tries`` times (a bound, not a timing)."""
    for _ in range(tries):
        if condition():  # type: ignore[operator]
            return
        subprocess.run(["sleep", "0.05"], check=True)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture
def collector_cli(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[str]]]:
    """``memwarden collect`` on loopback port 0, in a process group of its own."""
    out = tmp_path / "collected"
    out.mkdir()
    proc = subprocess.Popen(
        _cli("collect", "--listen", "127.0.0.1:0", "-o", str(out)),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # blocks until it listens
        assert "collecting on tcp://127.0.0.1:" in first, first
        address = first.split("collecting on ")[1].split(" into ")[0]
        yield address, out, proc
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def _peak(path: Path) -> int:
    try:
        return memwarden.summary(memwarden.load(path)).peak_bytes
    except Exception:
        return -1


def test_a_container_kill_leaves_the_trace_at_the_collector(
    collector_cli: tuple[str, Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    address, collected, collector = collector_cli
    script, marker, out = tmp_path / "sleeper.py", tmp_path / "ready", tmp_path / "local.mwtrace"
    script.write_text(SLEEPER)
    traced = subprocess.Popen(
        _cli("trace", "--sink", address, "-o", str(out), str(script), str(marker)),
        cwd=str(tmp_path),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait(lambda: marker.exists() or traced.poll() is not None, "the script's marker")
        assert traced.poll() is None, traced.stderr.read() if traced.stderr else ""
        _wait(lambda: any(_peak(p) >= KEPT for p in collected.glob("*.mwtrace")), "the flushed bytes at the collector")
        os.killpg(traced.pid, signal.SIGKILL)  # the supervisor and the script together
        traced.wait(timeout=60)
    finally:
        if traced.poll() is None:
            os.killpg(traced.pid, signal.SIGKILL)
            traced.wait(timeout=60)
    assert traced.returncode == -signal.SIGKILL
    assert out.read_bytes()[:8] == STREAM_MAGIC  # nobody finished the local file: the container's copy
    (path,) = collected.glob("*.mwtrace")
    assert path.name.startswith("sleeper-") and path.read_bytes()[:8] == STREAM_MAGIC
    trace = memwarden.load(path)
    assert memwarden.summary(trace).peak_bytes >= KEPT  # the events before the kill
    assert trace.metadata["recovered"]["complete"] is False  # says it was cut off
    assert trace.metadata["sink"]["file"] == path.name
    assert collector.poll() is None  # the collector lives on


def test_a_normal_end_sends_the_complete_trace(tmp_path: Path) -> None:
    """Over a Unix socket, collector in this process: the complete trace replaces the stream."""
    out = tmp_path / "collected"
    out.mkdir()
    lines: list[str] = []
    collector = Collector(SinkAddress.parse(f"unix:{tmp_path / 's.sock'}", listening=True), out, log=lines.append)
    bound = collector.bind()
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        script = tmp_path / "quick.py"
        script.write_text(QUICK)
        proc = subprocess.run(
            _cli("trace", "--sink", str(bound), "-o", str(tmp_path / "q.mwtrace"), str(script)),
            capture_output=True,
            text=True,
            timeout=300,
            cwd=str(tmp_path),
        )
    finally:
        collector.shutdown()
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob("*.mwtrace")
    assert f"holds {path.name}: complete trace" in proc.stderr
    assert path.read_bytes()[:8] == FORMAT_MAGIC
    trace = memwarden.load(path)
    assert trace.metadata["exit_status"] == 0 and "recovered" not in trace.metadata
    assert memwarden.summary(trace).peak_bytes >= 4 * 4 * MIB
    assert not list(out.glob(".*"))  # no partial file left
    assert all("\n" not in line for line in lines)


def test_a_directory_sink_holds_the_complete_trace(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    script = tmp_path / "quick.py"
    script.write_text(QUICK)
    proc = subprocess.run(
        _cli("trace", "--sink", str(volume), "-o", str(tmp_path / "q.mwtrace"), str(script)),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    (path,) = volume.glob("quick-*.mwtrace")
    assert memwarden.load(path).metadata["exit_status"] == 0


def test_an_unreachable_sink_is_one_line_before_the_script_runs(tmp_path: Path) -> None:
    script = tmp_path / "marks.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        proc = subprocess.run(
            _cli("trace", "--sink", f"127.0.0.1:{port}", "-o", str(tmp_path / "x.mwtrace"), str(script)),
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--sink" in proc.stderr, proc.stderr
    assert not (tmp_path / "ran").exists()
    for bad in ("nonsense", "host:99999", "tcp://:x"):
        proc = subprocess.run(_cli("trace", "--sink", bad, str(script)), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


def test_collect_listens_on_loopback_unless_told(tmp_path: Path) -> None:
    proc = subprocess.run(
        _cli("collect", "--listen", "0.0.0.0:0", "-o", str(tmp_path)), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "--allow-remote" in proc.stderr and proc.stderr.count("\n") == 1
    proc = subprocess.run(
        _cli("collect", "--listen", "127.0.0.1:0", "-o", str(tmp_path / "none")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


# -- hostile clients ---------------------------------------------------------------------------
RUN = "0123456789abcdef"


def _header(**fields: object) -> bytes:
    return (
        SINK_MAGIC
        + json.dumps({"kind": "stream", "run": RUN, "name": "x", "part": 1, "initial": 16, **fields}).encode()
        + b"\n"
    )


def _talk(address: SinkAddress, data: bytes, hold: bool = False) -> str | socket.socket:
    sock = socket.create_connection((address.host, address.port), timeout=60)
    sock.sendall(data)
    if hold:
        return sock
    sock.shutdown(socket.SHUT_WR)
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    sock.close()
    return got.decode()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[SinkAddress, Path, list[str]]]:
    out = tmp_path / "collected"
    out.mkdir()
    lines: list[str] = []
    collector = Collector(
        SinkAddress.parse("127.0.0.1:0", listening=True), out, max_part_bytes=4096, max_connections=2, log=lines.append
    )
    bound = collector.bind()
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        yield bound, out, lines
    finally:
        collector.shutdown()


STREAM = STREAM_MAGIC + b"\x01\x00\x00\x00\x00\x00\x00\x00"  # a header with no chunk: 16 bytes


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not a memwarden sink"),
        (SINK_MAGIC + b"x" * 5000, "header longer than 4096"),
        (SINK_MAGIC + b"[" * 3000 + b"\n", "not JSON"),
        (SINK_MAGIC + b"[1, 2]\n", "JSON object"),
        (_header(name="../../escape"), "'name'"),
        (_header(name=".hidden"), "'name'"),
        (_header(run="../" + RUN), "'run'"),
        (_header(kind="exec"), "'kind'"),
        (_header(part=True), "'part'"),
        (_header(initial=1 << 40), "'initial'"),
        (_header() + b"#!/bin/sh\nrm -rf /\n", "not a memwarden stream"),
        (_header(kind="final", size=100) + FORMAT_MAGIC + b"\0" * 10, "cut at 18 of 100"),
        (_header(kind="final", size=20) + FORMAT_MAGIC + b"\0" * 40, "more than the 20 bytes"),
        (_header() + STREAM + b"\0" * 9000, "over the collector's limit"),
    ],
)
def test_hostile_input_is_answered_in_one_line(
    served: tuple[SinkAddress, Path, list[str]], tmp_path: Path, data: bytes, says: str
) -> None:
    address, out, lines = served
    reply = _talk(address, data)
    assert isinstance(reply, str)
    # one line of refusal, the last (after the header's "ok" where the header was sound)
    assert [line for line in reply.splitlines() if line != "ok"] == [reply.splitlines()[-1]], reply
    assert reply.splitlines()[-1].startswith("error: ") and says in reply, reply
    assert any(says in line for line in lines) and all("\n" not in line for line in lines)
    outside = {p.name for p in tmp_path.iterdir()}
    assert outside == {"collected"}  # nothing written beside the folder
    for path in out.iterdir():  # at most the kept part of an over-long stream, within the limit
        assert path.name == f"x-{RUN}.mwtrace" and path.stat().st_size <= 4096
    assert _talk(address, _header(kind="hello")).startswith("ok")  # still serving


def test_no_link_leads_out_of_the_folder(served: tuple[SinkAddress, Path, list[str]], tmp_path: Path) -> None:
    address, out, _ = served
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (out / f".x-{RUN}.mwtrace.1.partial").symlink_to(victim)  # a planted link where the part would go
    reply = _talk(address, _header() + STREAM)
    assert isinstance(reply, str) and reply.startswith("error: cannot store"), reply
    (out / f"x-{RUN}.mwtrace").symlink_to(victim)  # a link where the run's file goes: replaced, not followed
    reply = _talk(address, _header(part=2) + STREAM)
    assert isinstance(reply, str) and "stream part 2" in reply, reply
    assert victim.read_text() == "keep" and not (out / f"x-{RUN}.mwtrace").is_symlink()


def test_connections_are_capped_and_older_parts_refused(served: tuple[SinkAddress, Path, list[str]]) -> None:
    address, out, _ = served
    held = []
    for n in (5, 6):  # one after the other: part 6 must not be installed before part 5 is opened
        sock = _talk(address, _header(part=n) + STREAM, hold=True)
        assert isinstance(sock, socket.socket)
        assert sock.recv(3) == b"ok\n"  # it holds its slot now
        held.append(sock)
    reply = _talk(address, _header(kind="hello"))
    assert reply == "error: too many connections\n"
    for sock in held:
        assert isinstance(sock, socket.socket)
        sock.close()
    # Part 4 is older than both: refused, and once part 6's handler has run, by its name.
    _wait(lambda: "not newer than the run's part 6" in str(_talk(address, _header(part=4) + STREAM)), "part 6 in")
    assert (out / f"x-{RUN}.mwtrace").read_bytes() == STREAM
