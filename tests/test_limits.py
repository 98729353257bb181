"""Real memory limits (issue 16): cgroup v2/v1 files and RLIMIT_AS read by telemetry, capped or refused
telemetry figures, telemetry logs read in bounded memory, and campaign configs refused before anything
runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memwarden.errors import InputError
from memwarden.govern.limits import LimitsSource, own_cgroup_dir, read_cgroup, read_limits
from memwarden.govern.telemetry import parse_tegrastats
from memwarden.resilience.config import parse_config

MIB = 2**20


def _files(directory: Path, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text + "\n")
    return directory


def test_cgroup_v2_limits_and_usage_less_reclaimable_cache(tmp_path):
    cg = _files(
        tmp_path,
        memory_max=str(450 * MIB),
        memory_high="max",
        memory_current=str(300 * MIB),
        memory_stat=f"anon {200 * MIB}\ninactive_file {50 * MIB}\nactive_file 0",
    )
    limits = read_cgroup(cg)
    assert limits.cgroup_max_bytes == 450 * MIB and limits.cgroup_high_bytes is None
    assert limits.available_bytes == 200 * MIB  # 450 - (300 - 50)


def test_cgroup_v2_high_binds_below_max_and_ancestors_count(tmp_path):
    root = _files(tmp_path, memory_max=str(300 * MIB), memory_current=str(10 * MIB))
    leaf = _files(root / "app", memory_max="max", memory_high=str(400 * MIB), memory_current=str(100 * MIB))
    limits = read_cgroup(leaf, root=root)
    assert limits.limit_bytes == 300 * MIB  # the parent's max binds the child
    assert limits.available_bytes == 200 * MIB


def test_cgroup_v1_names(tmp_path):
    cg = _files(
        tmp_path,
        memory_limit_in_bytes=str(1024 * MIB),
        memory_soft_limit_in_bytes="9223372036854771712",
        memory_usage_in_bytes=str(600 * MIB),
        memory_stat=f"total_inactive_file {100 * MIB}",
    )
    limits = read_cgroup(cg)
    assert (limits.cgroup_max_bytes, limits.cgroup_high_bytes) == (1024 * MIB, None)  # v1's "no limit" is none
    assert limits.available_bytes == 524 * MIB


def test_own_cgroup_is_found_from_proc_self_cgroup(tmp_path):
    mount = tmp_path / "sys"
    _files(mount / "memory" / "docker" / "abc", memory_limit_in_bytes=str(MIB))
    v1 = tmp_path / "cgroup.v1"
    v1.write_text("5:cpu:/\n4:memory:/docker/abc\n0::/\n")
    assert own_cgroup_dir(v1, mount) == (mount / "memory" / "docker" / "abc", mount / "memory")
    _files(mount / "user.slice", memory_current="1", memory_max=str(2 * MIB))
    v2 = tmp_path / "cgroup.v2"
    v2.write_text("0::/user.slice\n")
    found = own_cgroup_dir(v2, mount)
    assert found is not None and read_cgroup(found[0], root=found[1]).cgroup_max_bytes == 2 * MIB


def test_limits_source_reports_the_cgroup_not_the_host(tmp_path):
    cg = _files(tmp_path / "cg", memory_max=str(450 * MIB), memory_current=str(150 * MIB))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {32 * 1024 * 1024} kB\nMemAvailable: {24 * 1024 * 1024} kB\n")
    reading = LimitsSource(cgroup_dir=cg, meminfo=meminfo).read()
    assert reading == {"mem_total_bytes": 450 * MIB, "mem_available_bytes": 300 * MIB}


def test_telemetry_under_rlimit_as_reports_the_limit():
    """A real address-space limit: telemetry's available memory is what the process may still map."""
    script = """
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1500 * 2**20, resource.RLIM_INFINITY))
        from memwarden.govern.limits import read_limits
        from memwarden.govern.telemetry import Telemetry
        with Telemetry.detect(tegrastats=False) as t:
            sample = t.sample()
        print(sample.mem_total_bytes, sample.mem_available_bytes, t.origin["mem_available_bytes"])
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    total, available, origin = proc.stdout.split()
    assert int(total) <= 1500 * MIB and int(available) < 1500 * MIB
    assert origin == "limits"


def test_read_limits_without_a_limit_is_none(tmp_path):
    limits = read_limits(cgroup_dir=_files(tmp_path, memory_max="max", memory_current="5"))
    assert limits.cgroup_max_bytes is None and limits.cgroup_high_bytes is None
    assert limits.cgroup_used_bytes == 5


@pytest.mark.parametrize(
    "line",
    [
        "RAM 99999999999999999999/99999999999999999999MB CPU [1%@100]",
        "RAM 1/2MB SWAP 99999999999999999999/99999999999999999999MB",
    ],
)
def test_tegrastats_figures_out_of_range_are_refused(line):
    with pytest.raises(ValueError, match="out of range"):
        parse_tegrastats(line)


def test_blank_telemetry_lines_are_read_in_bounded_memory(tmp_path):
    """120 MB of blank lines, read under an address-space limit of 100 MB more than the interpreter
    has mapped: the old reader (the whole file, then a list of its lines) could not."""
    log = tmp_path / "blank.jsonl"
    with log.open("w") as f:
        f.write('{"t": 0, "mem_available_bytes": 1000}\n')
        line = " " * 1023 + "\n"
        for _ in range(120):
            f.write(line * 1024)
        f.write('{"t": 1, "mem_available_bytes": 900}\n')
    script = """
        import resource, sys
        from memwarden.govern.telemetry_log import load_log
        with open("/proc/self/status") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
        resource.setrlimit(resource.RLIMIT_AS, (mapped + 100 * 2**20, resource.RLIM_INFINITY))
        print(len(load_log(sys.argv[1])))
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(log)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["2"]


# -- campaign configs -----------------------------------------------------------------------

_CONFIG = """
[workload]
scenario = "demo-chat"
model = "{model}"
size = "tiny"
{workload}
[serving]
mode = "{mode}"
{serving}
"""


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"model": "no-such-model"}, "workload.model"),
        ({"mode": "os:system"}, "standard library"),
        ({"mode": "subprocess:run"}, "standard library"),
        ({"mode": "not a factory"}, "serving.mode"),
        ({"workload": 'governed = "no"'}, "workload.governed"),
        ({"workload": "thermal = 1"}, "workload.thermal"),
        ({"mode": "governed", "serving": "[serving.options]\nno_such_knob = 1"}, "no_such_knob"),
        ({"serving": "[serving.options]\nkv_fraction = 0.5"}, "takes no options"),
    ],
)
def test_campaign_config_mistakes_are_one_error(fields, problem):
    text = _CONFIG.format(**{"model": "llava", "mode": "plain", "workload": "", "serving": "", **fields})
    with pytest.raises(InputError, match=problem):
        parse_config(text.encode())


def test_a_good_campaign_config_still_parses():
    text = _CONFIG.format(
        model="llava", mode="governed", workload="governed = false", serving="[serving.options]\nkv_fraction = 0.5"
    )
    config = parse_config(text.encode())
    assert config.options == {"kv_fraction": 0.5} and config.workload["governed"] is False


def test_stress_refuses_a_bad_config_before_running(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(_CONFIG.format(model="llava", mode="os:system", workload="", serving=""))
    good = Path(__file__).parents[1] / "examples" / "stress" / "plain.toml"
    proc = subprocess.run(
        [sys.executable, "-m", "memwarden.cli", "stress", "--a", str(bad), "--b", str(good), "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert len(proc.stderr.strip().splitlines()) == 1 and "standard library" in proc.stderr, proc.stderr
