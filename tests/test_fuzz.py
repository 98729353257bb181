"""Hostile input: every loader of untrusted data raises its one clear error, in bounded memory,
and never runs code from a file. A short hypothesis run; benchmarks/bench_fuzz.py runs 10k+ cases."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memwarden.errors import InputError, MemwardenError
from memwarden.trace.model import TraceFormatError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_fuzz  # noqa: E402

FAST = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
CLEAR = (MemwardenError, TraceFormatError)
TRACE = bench_fuzz.seed_trace()
SNAPSHOT = bench_fuzz.seed_snapshot()
DEVICE = bench_fuzz.seed_device()


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    buf = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["cut", "set", "insert", "huge"]))
        pos = draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "cut":
            del buf[pos:]
        elif kind == "set" and buf:
            buf[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            buf[pos:pos] = draw(st.binary(max_size=32) | st.sampled_from(bench_fuzz._INTERESTING))
        elif len(buf) > pos + 8:
            buf[pos : pos + 8] = (2**64 - 1).to_bytes(8, "little")
    return bytes(buf)


@FAST
@given(data=mutated(TRACE) | st.binary(max_size=256))
def test_trace_loader(data: bytes, tmp_path_factory) -> None:
    from memwarden.interop.files import load_any
    from memwarden.trace.format import loads

    with contextlib.suppress(TraceFormatError):
        loads(data)
    path = tmp_path_factory.mktemp("t") / "case.mwtrace"
    path.write_bytes(data)
    with contextlib.suppress(InputError):
        load_any(path)


def test_trace_header_nesting_and_huge_numbers() -> None:
    import struct

    from memwarden.trace.format import FORMAT_MAGIC, loads

    for header in (b"[" * 100_000 + b"]" * 100_000, b'{"payload_bytes": ' + b"9" * 5000 + b"}"):
        with pytest.raises(TraceFormatError):
            loads(FORMAT_MAGIC + struct.pack("<IQ", 1, len(header)) + header)


plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)
snapshot_like = st.fixed_dictionaries(
    {
        "segments": st.lists(
            st.dictionaries(st.sampled_from(["device", "address", "total_size", "blocks", "stream"]), plain), max_size=3
        ),
        "device_traces": st.lists(
            st.lists(
                st.dictionaries(st.sampled_from(["action", "addr", "size", "time_us", "frames", "stream"]), plain),
                max_size=4,
            ),
            max_size=2,
        ),
    }
)


@FAST
@given(data=mutated(SNAPSHOT) | st.binary(max_size=256) | snapshot_like.map(lambda d: pickle.dumps(d, protocol=4)))
def test_snapshot_importer(data: bytes) -> None:
    from memwarden.interop.snapshot import load_snapshot

    with contextlib.suppress(InputError):
        load_snapshot(data)


@pytest.mark.parametrize("data", bench_fuzz.hostile_pickles(), ids=lambda d: repr(d[:12]))
def test_hostile_pickles_refused_in_bounded_memory(data: bytes) -> None:
    """Resident memory stays bounded (VmHWM, reset before). A huge declared BINBYTES length makes
    CPython's unpickler reserve that much address space before reading, but never touch it: see
    docs/security.md."""
    from memwarden.interop.snapshot import load_snapshot
    from memwarden.resilience.worker import peak_rss_bytes, reset_peak_rss

    bench_fuzz.MARKER.unlink(missing_ok=True)
    reset_peak_rss()
    before = peak_rss_bytes()
    with contextlib.suppress(InputError):  # two of them are odd but legal snapshots
        load_snapshot(data)
    assert not bench_fuzz.MARKER.exists(), "a pickle ran code"
    assert peak_rss_bytes() - before < 64 << 20


def test_hostile_pickle_error_names_the_callable() -> None:
    from memwarden.interop.snapshot import load_snapshot

    with pytest.raises(InputError, match="refused: pickle references os.system"):
        load_snapshot(bench_fuzz.hostile_pickles()[0])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=25,
)
config_like = st.dictionaries(
    st.sampled_from(["model_type", "text_config", "vision_config", "architectures", "image_token_index", "vocab_size"]),
    json_values,
    max_size=5,
).map(lambda d: {"model_type": "llava", **d} if len(d) % 2 else d)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=config_like.map(lambda d: json.dumps(d).encode()) | mutated(bench_fuzz.seed_config()))
def test_config_loader(data: bytes, tmp_path_factory) -> None:
    from memwarden.estimation.resolve import resolve_model

    path = tmp_path_factory.mktemp("c") / "config.json"
    path.write_bytes(data)
    with contextlib.suppress(InputError):
        resolve_model(str(path))


@pytest.mark.parametrize(
    "text",
    [
        b"[" * 100_000,
        b'{"model_type": ' + b"9" * 5000 + b"}",
        b'{"model_type": []}',
        b'{"model_type": "llava", "text_config": {"num_hidden_layers": 1000000000}}',
    ],
    ids=["deep", "digits", "list-model-type", "absurd-size"],
)
def test_config_loader_known_gaps(text: bytes, tmp_path) -> None:
    from memwarden.estimation.resolve import resolve_model

    path = tmp_path / "config.json"
    path.write_bytes(text)
    with pytest.raises(InputError):
        resolve_model(str(path))


@FAST
@given(data=mutated(DEVICE) | st.text(max_size=300).map(str.encode) | st.binary(max_size=128))
def test_device_profile_loader(data: bytes) -> None:
    from memwarden.models.devices import parse_profile

    with contextlib.suppress(InputError):
        parse_profile(data, label="fuzz.toml")


cli_word = st.sampled_from(bench_fuzz._CLI_WORDS) | st.text(max_size=12)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(argv=st.lists(cli_word, max_size=6).filter(lambda a: "ray" not in a and "--executor" not in a))
def test_cli_arguments(argv: list[str]) -> None:
    from memwarden.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            assert isinstance(main(argv), int)
        except SystemExit:
            pass
