"""memwarden doctor: scenario fact files built from public issues get the right finding and fix;
this machine's real facts are collected without torch and without tracebacks; sources that are
missing or unreadable are facts; bad input is one error line and exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memwarden.edge.doctor import facts as doctor_facts
from memwarden.edge.doctor import versions
from memwarden.edge.doctor.checks import diagnose, known_issues
from memwarden.edge.doctor.derive import derive
from memwarden.edge.doctor.pipeline import read as read_pipeline
from memwarden.edge.doctor.sources import audio, caches, probes, thermal
from memwarden.errors import InputError

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"
SCENARIOS = sorted(FIXTURES.glob("*.json"))


def test_there_are_at_least_twenty_scenarios_from_public_sources() -> None:
    public = [p for p in SCENARIOS if json.loads(p.read_text())["scenario"]["source"].startswith("https://")]
    assert len(public) >= 20
    # every known issue is exercised by at least one scenario
    expected = {i for p in SCENARIOS for i in json.loads(p.read_text())["scenario"]["expect"]}
    assert {e["id"] for e in known_issues()["issues"]} - expected <= {"video-fps-mismatch"}


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_gets_its_finding_and_fix(path: Path) -> None:
    facts = doctor_facts.load(path)
    scenario = facts["scenario"]
    findings = diagnose(facts)
    assert sorted(f.id for f in findings) == sorted(scenario["expect"])
    for finding_id, text in scenario["fix_contains"].items():
        finding = next(f for f in findings if f.id == finding_id)
        assert text in finding.fix
        assert finding.sources and finding.symptom and finding.affected


def test_clean_environment_has_no_finding() -> None:
    assert diagnose(doctor_facts.load(FIXTURES / "clean.json")) == []


def test_known_issue_entries_are_complete_and_cite_sources() -> None:
    data = known_issues()
    ids = [e["id"] for e in data["issues"]]
    assert len(ids) == len(set(ids))
    for entry in data["issues"]:
        for key in ("title", "severity", "when", "symptom", "fix", "affected", "sources"):
            assert entry[key], (entry["id"], key)
        assert entry["severity"] in ("high", "medium", "low")
        assert all(s.startswith("https://") or "design document" in s for s in entry["sources"])


def test_entries_without_a_public_source_say_they_are_unverified_and_what_was_searched() -> None:
    unsourced = [e for e in known_issues()["issues"] if not any(s.startswith("https://") for s in e["sources"])]
    assert {e["id"] for e in unsourced} >= {"snapdragon-8gen2-qnn-memmap", "dimensity-9200-av1-dma"}
    for entry in unsourced:
        check = entry["verification"]
        assert check["status"] == "unverified" and check["searched"] and check["note"], entry["id"]
        assert all(url.startswith("https://") for url in check["related"]), entry["id"]


def test_versions_compare_release_numbers() -> None:
    assert versions.matches("1.20.1", ">=1.19,<1.22")
    assert not versions.matches("1.18.1", ">=1.19")
    assert versions.matches("2.4.0+cu121", ">=2.4")
    assert versions.matches("1.28.0.dev20260623002", ">=1.27")
    assert versions.matches("12.4.127", "==12.4")
    assert not versions.matches("unknown", ">=1")
    assert versions.parse("9.1.0.70") == (9, 1, 0, 70)


def test_collect_on_this_machine_is_complete_serialisable_and_round_trips(tmp_path: Path) -> None:
    facts = doctor_facts.collect()
    for section in doctor_facts.SECTIONS:
        assert section in facts
    for section in ("platform", "packages", "torch", "onnxruntime", "nvidia", "jetson", "audio", "memory", "thermal"):
        assert facts[section]["status"] in ("present", "not present", "broken"), (section, facts[section])
    assert facts["packages"]["installed"]["numpy"]  # read from metadata, not imported
    with open("/proc/meminfo") as fh:
        total_kib = int(fh.readline().split()[1])
    assert facts["memory"]["total_bytes"] == total_kib * 1024
    diagnose(facts)  # whatever this machine is, checking it does not raise
    path = doctor_facts.dump(facts, tmp_path / "facts.json")
    assert doctor_facts.load(path)["memory"] == json.loads(json.dumps(facts["memory"]))


def test_doctor_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "from memwarden.edge.doctor import facts, checks\n"
        "checks.diagnose(facts.collect())\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') or m == 'transformers'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_missing_sources_are_facts(tmp_path: Path) -> None:
    assert thermal.collect(str(tmp_path / "nothing"))["status"] == "not present"
    assert audio.collect(str(tmp_path / "nothing"))["status"] == "not present"
    assert caches.collect((str(tmp_path / "nothing"),)) == []


def test_alsa_hw_params_are_read_and_an_unreadable_one_is_a_fact(tmp_path: Path) -> None:
    sub = tmp_path / "card1" / "pcm0c" / "sub0"
    sub.mkdir(parents=True)
    (sub / "hw_params").write_text(
        "access: RW_INTERLEAVED\nformat: S16_LE\nsubformat: STD\nchannels: 2\nrate: 44100 (44100/1)\n"
    )
    closed = tmp_path / "card0" / "pcm0p" / "sub0"
    closed.mkdir(parents=True)
    (closed / "hw_params").write_text("closed\n")
    broken = tmp_path / "card2" / "pcm0c" / "sub0" / "hw_params"
    broken.mkdir(parents=True)  # a directory where a file should be: reading it fails
    found = {d["id"]: d for d in audio.collect(str(tmp_path))["devices"]}
    assert found["card1/pcm0c/sub0"]["rate_hz"] == 44100 and found["card1/pcm0c/sub0"]["channels"] == 2
    assert found["card0/pcm0p/sub0"]["state"] == "closed" and found["card0/pcm0p/sub0"]["direction"] == "playback"
    assert found["card2/pcm0c/sub0"]["state"] == "unreadable"
    clean = doctor_facts.load(FIXTURES / "clean.json")
    clean["audio"] = audio.collect(str(tmp_path))
    assert [f.id for f in diagnose(clean)] == ["audio-rate-mismatch"]
    assert "44100" in diagnose(clean)[0].detail


def test_thermal_zone_near_its_trip_point_is_found(tmp_path: Path) -> None:
    zone = tmp_path / "thermal_zone0"
    zone.mkdir()
    (zone / "type").write_text("gpu-thermal\n")
    (zone / "temp").write_text("97500\n")
    (zone / "trip_point_0_type").write_text("passive\n")
    (zone / "trip_point_0_temp").write_text("99000\n")
    cool = tmp_path / "thermal_zone1"
    cool.mkdir()
    (cool / "type").write_text("cpu-thermal\n")
    (cool / "temp").write_text("garbage\n")  # unparsable: temp unknown, not an error
    facts = thermal.collect(str(tmp_path))
    assert facts["zones"][0]["temp_c"] == 97.5 and facts["zones"][1]["temp_c"] is None
    assert derive({"thermal": facts}, {})["hot_zones"] == ["gpu-thermal at 97.5 °C (trip 99 °C)"]


def test_cache_builder_version_from_a_version_named_directory(tmp_path: Path) -> None:
    cache = tmp_path / "trt-8.6.1"
    cache.mkdir()
    (cache / "model_sm86.engine").write_bytes(b"\0" * 16)
    (entry,) = caches.collect((str(cache),))
    assert entry["kind"] == "tensorrt" and entry["built_by"] == {"tensorrt": "8.6.1"} and entry["files"] == 1
    clean = doctor_facts.load(FIXTURES / "clean.json")
    clean["caches"] = [entry]
    assert [f.id for f in diagnose(clean)] == ["tensorrt-engine-cache-stale"]


def test_pipeline_configs_pbtxt_and_json(tmp_path: Path) -> None:
    pbtxt = tmp_path / "graph.pbtxt"
    pbtxt.write_text(
        'node {\n  calculator: "AudioResampler"\n  options { target_sample_rate: 16000 }\n}\nnode { options { frame_rate: 30 } }\n'
    )
    assert read_pipeline(pbtxt) | {"path": ""} == {
        "path": "",
        "audio_rate_hz": 16000.0,
        "video_fps": 30.0,
        "video_codec": None,
    }
    js = tmp_path / "p.json"
    js.write_text(json.dumps({"audio": {"sample_rate": 48000}, "video": {"fps": 25, "codec": "AV1"}}))
    assert read_pipeline(js)["video_codec"] == "av1"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_pipeline(bad)
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(InputError, match="no sample rate"):
        read_pipeline(empty)


def test_probe_runner_reports_results_errors_and_timeouts() -> None:
    out = probes.run(
        {"ok": "print('{\"a\": 1}')", "crash": "raise SystemExit('boom')", "hang": "import time; time.sleep(120)"},
        timeout_s=3.0,
    )
    assert out["ok"]["status"] == "ok" and out["ok"]["result"] == {"a": 1}
    assert out["crash"] == {"status": "error", "error": "boom"}
    assert out["hang"]["status"] == "timed out"


def test_cli_doctor_on_this_machine_json(cli) -> None:
    result = cli("doctor", "--json")
    assert result.returncode in (0, 1), result.stderr
    payload = json.loads(result.stdout)
    assert isinstance(payload["findings"], list) and payload["facts"]["schema"] == doctor_facts.SCHEMA
    assert result.stderr == ""


def test_cli_collect_then_diagnose_elsewhere(cli, tmp_path: Path) -> None:
    out = tmp_path / "facts.json"
    assert cli("doctor", "--collect", "-o", str(out)).returncode == 0
    assert doctor_facts.load(out)["schema"] == doctor_facts.SCHEMA
    assert cli("doctor", "--facts", str(out), "--json").returncode in (0, 1)
    scenario = cli("doctor", "--facts", str(FIXTURES / "k8s_limit_500mib.json"))
    assert scenario.returncode == 1
    assert (
        "cgroup-limit-below-host" in scenario.stdout
        and "https://github.com/kubernetes/kubernetes/issues/114142" in scenario.stdout
    )
    assert cli("doctor", "--facts", str(FIXTURES / "clean.json")).returncode == 0


def test_cli_pipeline_overrides_the_facts_pipeline(cli, tmp_path: Path) -> None:
    config = tmp_path / "graph.json"
    config.write_text(json.dumps({"sample_rate": 48000, "fps": 25}))
    result = cli("doctor", "--facts", str(FIXTURES / "clean.json"), "--pipeline", str(config), "--json")
    assert [f["id"] for f in json.loads(result.stdout)["findings"]] == ["audio-rate-mismatch"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{broken", "invalid JSON"),
        ('{"schema": "something-else"}', "not a facts file"),
        ('{"schema": "memwarden-doctor-facts/1", "caches": {}}', "must be a JSON array"),
        ("[1, 2]", "not a facts file"),
    ],
)
def test_cli_bad_facts_file_is_one_error_line(cli, tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "facts.json"
    path.write_text(content)
    result = cli("doctor", "--facts", str(path))
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_missing_facts_file_and_output_without_collect(cli, tmp_path: Path) -> None:
    missing = cli("doctor", "--facts", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    wrong = cli("doctor", "-o", str(tmp_path / "x.json"))
    assert wrong.returncode == 2 and "--collect" in wrong.stderr and not (tmp_path / "x.json").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_facts_file(cli, tmp_path: Path) -> None:
    path = tmp_path / "facts.json"
    path.write_text("{}")
    path.chmod(0)
    result = cli("doctor", "--facts", str(path))
    assert result.returncode == 2 and "cannot read" in result.stderr


@pytest.mark.parametrize(
    "patch",
    [
        {"audio": {"devices": "card0"}},
        {"thermal": {"zones": [1, 2]}},
        {"memory": {"total_bytes": "big", "cgroup": {"limit_bytes": "small"}}},
        {"packages": {"installed": ["onnxruntime"]}},
        {"caches": [{"kind": "tensorrt", "built_by": "8.6"}]},
        {"onnxruntime": {"providers": {"CUDAExecutionProvider": None}}},
    ],
)
def test_cli_malformed_facts_values_never_traceback(cli, tmp_path: Path, patch: dict) -> None:
    facts = json.loads((FIXTURES / "clean.json").read_text())
    facts.update(patch)
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(facts))
    result = cli("doctor", "--facts", str(path))
    assert result.returncode in (0, 1, 2) and "Traceback" not in result.stderr, result.stderr
    if result.returncode == 2:
        assert len(result.stderr.strip().splitlines()) == 1
