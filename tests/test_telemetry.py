"""Telemetry: tegrastats parsing against recorded lines, replay-log validation, and sources that
are missing, unsupported or failing degrade instead of crashing."""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memwarden.errors import InputError
from memwarden.govern.telemetry import (
    FpsMeter,
    NvmlSource,
    SourceUnavailable,
    TegrastatsSource,
    Telemetry,
    TelemetrySample,
    ThermalZoneSource,
    detect_sources,
    parse_tegrastats,
)
from memwarden.govern.telemetry_log import ReplaySource, load_log, parse_jsonl

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
EXAMPLES = Path(__file__).parent.parent / "examples" / "telemetry"
MIB = 1 << 20


# -- tegrastats ---------------------------------------------------------------------------------


def test_tegrastats_orin_log() -> None:
    samples = load_log(FIXTURES / "tegrastats_orin_nano.log")
    assert [s.t_s for s in samples] == [0.0, 1.0, 2.0]  # from the timestamps
    first = samples[0]
    assert first.mem_total_bytes == 7620 * MIB
    assert first.mem_available_bytes == (7620 - 2791) * MIB
    assert first.swap_total_bytes == 3810 * MIB and first.swap_used_bytes == 0
    assert first.temp_c == 47.5  # the hottest sensor (cpu, tj)
    assert first.power_w == pytest.approx(4.84)  # VDD_IN, not the sum of rails
    assert samples[2].power_w == pytest.approx(11.84)  # current, not the average
    assert samples[2].swap_used_bytes == 12 * MIB


def test_tegrastats_old_format() -> None:
    samples = load_log(FIXTURES / "tegrastats_jetson_nano.log", interval_s=0.5)
    assert [s.t_s for s in samples] == [0.0, 0.5]  # no timestamps: line index x interval
    assert samples[0].temp_c == 45.5  # PMIC@100C is a placeholder, not the hottest sensor
    assert samples[1].temp_c == 46.0  # CV0@-256C is a disabled sensor
    assert samples[0].power_w == pytest.approx(2.233)  # POM_5V_IN, mW without a unit


def test_tegrastats_rails_summed_without_input_rail() -> None:
    line = "RAM 9000/62780MB (lfb 3x4MB) SWAP 0/31390MB VDD_GPU_SOC 2402mW/2402mW VDD_CPU_CV 400mW/400mW NC 0mW/0mW"
    assert parse_tegrastats(line)["power_w"] == pytest.approx(2.802)
    with pytest.raises(ValueError):
        parse_tegrastats("CPU [2%@729] GPU@46C")


# -- JSON-lines replay -------------------------------------------------------------------------


def test_examples_replay() -> None:
    for path in sorted(EXAMPLES.glob("*.jsonl")):
        replay = ReplaySource(path)
        assert len(replay) >= 100, path
        ts = [s.t_s for s in replay]
        assert ts == sorted(ts)
        assert all(s.mem_available_bytes is not None for s in replay)


def test_unsorted_duplicates_nan_and_missing_fields() -> None:
    lines = [
        '{"t": 2, "mem_available_bytes": 5}',
        "",
        '{"t": 1, "temp_c": NaN, "fps": 30}',
        '{"t": 2, "mem_available_bytes": 7, "extra": "ignored"}',
        '{"t": 0.5}',
    ]
    samples = parse_jsonl(lines)
    assert [s.t_s for s in samples] == [0.5, 1, 2, 2]
    assert [s.mem_available_bytes for s in samples[2:]] == [5, 7]  # equal t keep file order
    assert samples[1].temp_c is None and samples[1].fps == 30.0  # NaN = not measured


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("{not json", "Expecting"),
        ("[1, 2]", "JSON object"),
        ('{"mem_available_bytes": 1}', 'missing "t"'),
        ('{"t": NaN}', "finite"),
        ('{"t": Infinity}', "finite"),
        ('{"t": 1, "temp_c": "hot"}', '"temp_c" must be a number'),
        ('{"t": 1, "fps": true}', '"fps" must be a number'),
        ('{"t": 1, "mem_available_bytes": -1}', "outside"),
        ('{"t": 1, "power_w": Infinity}', "outside"),
        ('{"t": 1, "mem_total_bytes": 10, "mem_available_bytes": 11}', "exceeds"),
    ],
)
def test_malformed_line_names_its_number(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"t": 0, "temp_c": 40}\n\n' + line + "\n")
    with pytest.raises(InputError) as err:
        load_log(path)
    assert f"{path}: line 3: " in str(err.value) and words in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("content", [b"", b"\n\n", b"\xff\xfe garbage"])
def test_unusable_files(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(content)
    with pytest.raises(InputError):
        load_log(path)
    with pytest.raises(InputError, match="no such file"):
        load_log(tmp_path / "missing.jsonl")
    with pytest.raises(InputError, match="directory"):
        load_log(tmp_path)


_value = st.one_of(st.none(), st.floats(min_value=0, max_value=999), st.just(math.nan))


@settings(max_examples=60, deadline=None)
@given(st.floats(-1e6, 1e6), st.dictionaries(st.sampled_from(["temp_c", "power_w", "fps", "power_limit_w"]), _value))
def test_sample_json_round_trip(t: float, signals: dict[str, float | None]) -> None:
    sample = TelemetrySample.from_json({"t": t, **signals})
    again = TelemetrySample.from_json(json.loads(json.dumps(sample.to_json())))
    assert again == sample
    for k, v in signals.items():
        assert getattr(sample, k) == (None if v is None or math.isnan(v) else v)


def test_replay_source_steps_like_telemetry() -> None:
    replay = ReplaySource(FIXTURES / "tegrastats_orin_nano.log")
    seen = [replay.sample().t_s for _ in range(5)]
    assert seen == [0.0, 1.0, 2.0, 2.0, 2.0] and replay.exhausted


# -- live sources --------------------------------------------------------------------------------


class _Fake:
    def __init__(self, name: str, reading: dict[str, float] | Exception) -> None:
        self.name, self.reading, self.reads, self.closed = name, reading, 0, False

    def read(self) -> dict[str, float]:
        self.reads += 1
        if isinstance(self.reading, Exception):
            raise self.reading
        return dict(self.reading)

    def close(self) -> None:
        self.closed = True


def test_merge_first_source_wins_and_failures_degrade() -> None:
    broken = _Fake("nvml", RuntimeError("driver went away"))
    psutil_like = _Fake("psutil", {"mem_total_bytes": 8e9, "mem_available_bytes": 5e9, "temp_c": math.nan})
    thermal = _Fake("thermal_zone", {"temp_c": 51.0, "mem_available_bytes": 1.0})
    clock = iter(range(100))
    telemetry = Telemetry([broken, psutil_like, thermal], clock=lambda: float(next(clock)), max_failures=3)
    for _ in range(4):
        sample = telemetry.sample()
    assert sample.mem_available_bytes == 5_000_000_000  # psutil came first
    assert sample.temp_c == 51.0  # psutil's NaN left the field to the next source
    assert telemetry.origin == {"mem_total_bytes": "psutil", "mem_available_bytes": "psutil", "temp_c": "thermal_zone"}
    assert broken.reads == 3 and broken.closed  # dropped after three failures in a row
    assert [s.name for s in telemetry.sources] == ["psutil", "thermal_zone"]
    assert "driver went away" in telemetry.errors["nvml"]


def _fake_pynvml(monkeypatch: pytest.MonkeyPatch, *, memory_supported: bool) -> None:
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801 (the library's name)
        pass

    def memory(h: object) -> object:
        if not memory_supported:
            raise NVMLError_NotSupported("Not Supported")
        return types.SimpleNamespace(total=16 << 30, free=10 << 30, used=6 << 30)

    def unsupported(*args: object) -> object:
        raise NVMLError_NotSupported("Not Supported")

    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    mod.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    mod.nvmlInit = lambda: None  # type: ignore[attr-defined]
    mod.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: object()  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    mod.nvmlDeviceGetTemperature = lambda h, kind: 61  # type: ignore[attr-defined]
    mod.nvmlDeviceGetPowerUsage = lambda h: 23500  # type: ignore[attr-defined]  # mW
    mod.nvmlDeviceGetEnforcedPowerLimit = unsupported  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x20  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", mod)


def test_nvml_not_supported_on_jetson_degrades_per_query(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pynvml(monkeypatch, memory_supported=False)
    reading = NvmlSource().read()
    assert reading == {"temp_c": 61.0, "power_w": 23.5, "throttle_reasons": 0x20}  # no memory, no limit
    _fake_pynvml(monkeypatch, memory_supported=True)
    reading = NvmlSource().read()
    assert reading["mem_total_bytes"] == 16 << 30 and reading["mem_available_bytes"] == 10 << 30


def test_no_nvml_library_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with pytest.raises(SourceUnavailable):
        NvmlSource()


def test_thermal_zones(tmp_path: Path) -> None:
    for i, (kind, milli) in enumerate([("cpu-thermal", "48500"), ("cv0-thermal", "-256000"), ("gpu", "oops")]):
        zone = tmp_path / f"thermal_zone{i}"
        zone.mkdir()
        (zone / "type").write_text(kind)
        (zone / "temp").write_text(milli + "\n")
    assert ThermalZoneSource(tmp_path).read() == {"temp_c": 48.5}
    with pytest.raises(SourceUnavailable):
        ThermalZoneSource(tmp_path / "none")


def test_detect_never_raises(tmp_path: Path) -> None:
    sources = detect_sources(thermal_root=tmp_path / "none", fps_meter=FpsMeter())
    names = [s.name for s in sources]
    assert "psutil" in names and names[-1] == "app_fps"
    with Telemetry(sources) as telemetry:
        sample = telemetry.sample()
    assert sample.mem_available_bytes and sample.mem_available_bytes <= (sample.mem_total_bytes or 0)


def test_fps_meter() -> None:
    now = [0.0]
    meter = FpsMeter(window_s=2.0, clock=lambda: now[0])
    assert meter.read() == {}
    for _ in range(90):  # 30 fps for 3 s
        meter.frame()
        now[0] += 1 / 30
    assert meter.read()["fps"] == pytest.approx(30, rel=0.05)
    now[0] += 1.0  # the application stalls: the rate falls instead of holding
    assert meter.read()["fps"] == pytest.approx(15, rel=0.1)
    meter.report(24.0)
    assert meter.read() == {"fps": 24.0}


@pytest.mark.skipif(os.name != "posix", reason="fake tegrastats is a shell script")
def test_tegrastats_child_process(tmp_path: Path) -> None:
    line = (FIXTURES / "tegrastats_orin_nano.log").read_text().splitlines()[0]
    exe = tmp_path / "tegrastats"
    exe.write_text(f"#!/bin/sh\necho '{line}'\nsleep 30\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    source = TegrastatsSource(str(exe), interval_ms=100)
    try:
        for _ in range(200):
            if source.read():
                break
            __import__("time").sleep(0.01)
        assert source.read()["power_w"] == pytest.approx(4.84)
    finally:
        source.close()
    with pytest.raises(RuntimeError):
        source.read()  # exited: Telemetry drops it after max_failures
