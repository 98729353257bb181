"""load_any sniffing, and `memwarden export` as a real subprocess."""

from __future__ import annotations

import json
import os
import pickle
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memwarden.errors import InputError
from memwarden.interop.files import load_any
from memwarden.interop.snapshot import save_snapshot
from memwarden.trace import format as trace_format
from memwarden.trace import io as trace_io
from memwarden.trace import model
from test_snapshot import SNAPSHOT_FIXTURE, _Evil, built_trace, event_rows


@pytest.fixture(scope="module")
def mwtrace(tmp_path_factory) -> Path:
    return trace_io.save(built_trace(), tmp_path_factory.mktemp("traces") / "run.mwtrace")


def test_load_any_reads_both_formats(mwtrace, tmp_path):
    trace = load_any(mwtrace)
    assert event_rows(trace) == event_rows(built_trace())
    snapshot = save_snapshot(trace, tmp_path / "x.bin")  # the content decides, not the name
    assert event_rows(load_any(snapshot)) == event_rows(trace)
    assert load_any(SNAPSHOT_FIXTURE).metadata["source"] == "torch-snapshot"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "no such file"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b""), "file is empty"),
        (lambda p: p.write_text("segments,device_traces\n"), "unknown file type"),
        (lambda p: p.write_bytes(trace_format.FORMAT_MAGIC + b"\x01\x00"), "bad magic|truncated"),
        (lambda p: p.write_bytes(b"\x80\x04K\x07."), "top level is a int"),
    ],
)
def test_load_any_errors_name_the_file(tmp_path, make, message):
    path = tmp_path / "input"
    make(path)
    with pytest.raises(InputError, match=message) as info:
        load_any(path)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_load_any_wraps_corrupt_mwtrace(mwtrace, tmp_path):
    data = mwtrace.read_bytes()
    path = tmp_path / "cut.mwtrace"
    path.write_bytes(data[: len(data) - 10])
    with pytest.raises(InputError, match=f"{path}: trace is truncated"):
        load_any(path)


def test_unreadable_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = tmp_path / "secret.mwtrace"
    path.write_bytes(b"x")
    path.chmod(0)
    with pytest.raises(InputError, match="cannot read"):
        load_any(path)


def _valid_files() -> list[bytes]:
    return [trace_format.dumps(built_trace()), SNAPSHOT_FIXTURE.read_bytes()]


def _mutate(data: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data[: max(1, cut % (len(data) + 1))])
    for pos, value in flips:
        out[pos % len(out)] = value
    return bytes(out)


hostile_bytes = st.one_of(
    st.binary(max_size=512),
    st.binary(max_size=256).map(lambda b: trace_format.FORMAT_MAGIC + b),
    st.binary(max_size=256).map(lambda b: b"\x80" + b),
    st.builds(
        _mutate,
        st.sampled_from(_valid_files()),
        st.integers(0, 1 << 16),
        st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4),
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=hostile_bytes)
def test_load_any_raises_only_input_error(tmp_path, data):
    path = tmp_path / "fuzz.bin"
    path.write_bytes(data)
    try:
        trace = load_any(path)
    except InputError as exc:
        assert str(path) in str(exc)
    else:
        assert isinstance(trace, model.Trace)


# -- the export command ----------------------------------------------------------------


def test_export_chrome_and_snapshot(cli, mwtrace, tmp_path):
    out = tmp_path / "t.json"
    done = cli("export", str(mwtrace), "--format", "chrome", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["traceEvents"]

    out = tmp_path / "t.pickle"
    done = cli("export", str(mwtrace), "--format", "torch-snapshot", "-o", str(out))
    assert done.returncode == 0, done.stderr
    snapshot = pickle.loads(out.read_bytes())
    assert snapshot["device_traces"][0]
    assert sum(b["requested_size"] for s in snapshot["segments"] for b in s["blocks"]) == built_trace().live_bytes()[-1]

    out = tmp_path / "fixture.json"
    done = cli("export", str(SNAPSHOT_FIXTURE), "--format", "chrome", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["otherData"]["metadata"]["source"] == "torch-snapshot"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixture.json", "t.json", "t.pickle"]


def _assert_one_line_failure(done, out: Path, *fragments: str) -> None:
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".partial")]


def test_export_failures_are_one_line_and_write_nothing(cli, mwtrace, tmp_path):
    out = tmp_path / "out.json"
    missing = tmp_path / "missing.mwtrace"
    _assert_one_line_failure(cli("export", str(missing), "--format", "chrome", "-o", str(out)), out, "no such file")

    text = tmp_path / "notes.txt"
    text.write_text("hello")
    done = cli("export", str(text), "--format", "chrome", "-o", str(out))
    _assert_one_line_failure(done, out, "unknown file type", "notes.txt")

    done = cli("export", str(mwtrace), "--format", "svg", "-o", str(out))
    _assert_one_line_failure(done, out, "unknown --format 'svg'")

    done = cli("export", str(mwtrace), "--format", "chrome", "--allocator", "pytorch", "-o", str(out))
    _assert_one_line_failure(done, out, "--allocator applies only to --format torch-snapshot")

    evil = tmp_path / "evil.pickle"
    marker = Path(f"/tmp/PWNED_{uuid.uuid4().hex}")
    evil.write_bytes(pickle.dumps(_Evil(marker)))
    try:
        done = cli("export", str(evil), "--format", "torch-snapshot", "-o", str(out))
        _assert_one_line_failure(done, out, "refused: pickle references os.system")
        assert not marker.exists()
    finally:
        marker.unlink(missing_ok=True)


def test_export_allocator_needs_the_allocator_model(cli, mwtrace, tmp_path):
    out = tmp_path / "out.pickle"
    done = cli("export", str(mwtrace), "--format", "torch-snapshot", "--allocator", "pytorch", "-o", str(out))
    try:
        import memwarden.plan.allocator.model  # noqa: F401
    except ImportError:
        _assert_one_line_failure(done, out, "allocator model not available")
    else:
        assert done.returncode == 0, done.stderr
        snapshot = pickle.loads(out.read_bytes())
        from torch.cuda._memory_viz import segsum

        segsum(snapshot)


def test_export_keeps_old_output_when_it_fails(cli, mwtrace, tmp_path):
    out = tmp_path / "out.json"
    out.write_text("previous")
    done = cli("export", str(tmp_path / "missing"), "--format", "chrome", "-o", str(out))
    assert done.returncode != 0
    assert out.read_text() == "previous"
