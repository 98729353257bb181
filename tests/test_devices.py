"""Device profiles: the built-ins are sourced and consistent, and hostile files only ever raise InputError."""

from __future__ import annotations

import argparse
import json
import re
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memwarden.commands import devices as devices_command
from memwarden.errors import InputError
from memwarden.models import devices
from memwarden.models.device_profile import DeviceProfile
from memwarden.models.devices import list_profiles, load_profile, parse_profile

REQUIRED_IDS = {
    "jetson-orin-nano-8gb",
    "jetson-orin-nx-16gb",
    "jetson-agx-orin-64gb",
    "raspberry-pi-5-8gb",
    "iphone-15-pro",
    "galaxy-s24-ultra-12gb",
    "macbook-air-m2-16gb",
    "rtx-4060-8gb",
    "rtx-4090-24gb",
    "a100-80gb",
    "h200-141gb",
}
GIB = 1 << 30


def builtin_text(ident: str) -> str:
    return resources.files("memwarden.models").joinpath("devices", f"{ident}.toml").read_text("utf-8")


def write(tmp_path: Path, text: str | bytes, name: str = "mine.toml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def set_line(text: str, key: str, value: str, *, occurrence: int = 0) -> str:
    """Replace the value of the `occurrence`-th `key = ...` line (comment dropped)."""
    pattern = re.compile(rf"^{re.escape(key)} = .*$", re.MULTILINE)
    matches = list(pattern.finditer(text))
    m = matches[occurrence]
    return text[: m.start()] + f"{key} = {value}" + text[m.end() :]


def drop_line(text: str, key: str) -> str:
    return re.sub(rf"^{re.escape(key)} = .*\n", "", text, count=1, flags=re.MULTILINE)


# -- the built-in profiles -------------------------------------------------------------------------


def test_builtins_cover_the_required_devices_and_load() -> None:
    ids = devices.builtin_ids()
    assert len(ids) >= 12
    assert REQUIRED_IDS <= set(ids)
    assert {"t4-16gb", "l4-24gb"} & set(ids)
    for ident in ids:
        p = load_profile(ident)
        assert isinstance(p, DeviceProfile)
        assert p.id == ident
        assert p.source == f"builtin:{ident}"


def test_list_profiles_is_sorted_by_usable_memory() -> None:
    profiles = list_profiles()
    assert [p.id for p in profiles] == sorted(devices.builtin_ids(), key=lambda i: (load_profile(i).usable_bytes, i))
    usable = [p.usable_bytes for p in profiles]
    assert usable == sorted(usable)


@pytest.mark.parametrize("profile", list_profiles(), ids=lambda p: p.id)
def test_memory_invariants(profile: DeviceProfile) -> None:
    assert 0 < profile.os_reserved_bytes < profile.total_memory_bytes
    assert 0 < profile.usable_bytes < profile.total_memory_bytes
    names = [t.name for t in profile.tiers]
    assert len(names) == len(set(names))
    if profile.unified_memory:
        assert "device" not in names  # one shared pool: no separate accelerator memory
        assert profile.tier("host").capacity_bytes == profile.total_memory_bytes
        assert profile.compute_tier.name == "host"
    else:
        assert profile.tier("device").capacity_bytes == profile.total_memory_bytes
        assert profile.compute_tier.name == "device"
        assert profile.has_tier("host")
    assert profile.fastest_tier.bandwidth_gbps == max(t.bandwidth_gbps for t in profile.tiers)
    assert profile.compute.accelerators
    assert profile.telemetry


@pytest.mark.parametrize("ident", devices.builtin_ids())
def test_every_figure_line_cites_a_source(ident: str) -> None:
    """Each `key = <number|bool|array>` line carries a comment with a URL, a [n] reference or 'assumption'."""
    lines = builtin_text(ident).splitlines()
    refs: dict[str, str] = {}
    current = None
    for line in lines:
        if m := re.match(r"^# \[(\d+)\] (.*)$", line):
            current = m.group(1)
            refs[current] = m.group(2)
        elif current and re.match(r"^#\s{3,}\S", line):
            refs[current] += " " + line.lstrip("# ")
        else:
            current = None
    assert refs, "the header lists the sources"
    for n, text in refs.items():
        assert "https://" in text, f"{ident}.toml: source [{n}] has no URL"
    used: set[str] = set()
    for number, line in enumerate(lines, 1):
        m = re.match(r"^\s*([A-Za-z0-9_]+)\s*=\s*(.*)$", line)
        if not m:
            continue
        key, rest = m.groups()
        value, _, comment = rest.partition("#")
        value = value.strip()
        is_figure = bool(re.match(r"^[+-]?\d", value)) or value in ("true", "false") or value.startswith("[")
        if key in ("name", "id", "kind") or not is_figure:
            continue
        where = f"{ident}.toml:{number} ({key})"
        assert comment.strip(), f"{where}: figure without a source comment"
        cited = set(re.findall(r"\[(\d+)\]", comment))
        assert cited or "assumption" in comment or "https://" in comment, f"{where}: comment cites no source"
        assert cited <= set(refs), f"{where}: cites an undefined source {sorted(cited - set(refs))}"
        if "derived" in comment:
            assert cited, f"{where}: a derived figure names the sources it is derived from"
        used |= cited
    mentioned = {n for line in lines if not re.match(r"^# \[\d+\] ", line) for n in re.findall(r"\[(\d+)\]", line)}
    assert set(refs) <= mentioned, f"{ident}.toml: sources never cited: {sorted(set(refs) - mentioned)}"


def test_known_figures() -> None:
    """Spot checks against the published sheets, so an edit that breaks a headline number is noticed."""
    nano = load_profile("jetson-orin-nano-8gb")
    assert nano.total_memory_bytes == 8 * GIB and nano.unified_memory
    assert nano.tier("host").bandwidth_gbps == 68.0
    assert nano.compute.peak_tflops.int8 == 20.0
    assert load_profile("jetson-agx-orin-64gb").tier("host").bandwidth_gbps == 204.8
    assert load_profile("rtx-4090-24gb").tier("device").bandwidth_gbps == 1008.0
    a100 = load_profile("a100-80gb")
    assert a100.tier("device").bandwidth_gbps == 2039.0 and a100.compute.peak_tflops.bf16 == 312.0
    h200 = load_profile("h200-141gb")
    assert h200.total_memory_bytes == 141 * GIB and h200.tier("device").bandwidth_gbps == 4800.0
    assert 139 * GIB < h200.usable_bytes < 141 * GIB
    iphone = load_profile("iphone-15-pro")
    assert iphone.usable_bytes <= iphone.total_memory_bytes // 2  # iOS apps get much less than RAM
    mac = load_profile("macbook-air-m2-16gb")
    assert mac.usable_bytes == int(16 * GIB * 2 / 3)  # Metal's recommendedMaxWorkingSetSize on 16 GB


def test_tier_helpers() -> None:
    p = load_profile("rtx-4090-24gb")
    device = p.tier("device")
    assert device.transfer_us(0) == device.latency_us
    assert device.transfer_us(1_008_000_000) == pytest.approx(device.latency_us + 1000)  # 1.008 GB at 1008 GB/s: 1 ms
    with pytest.raises(KeyError, match=r"no .device. tier \(tiers: host, disk\)"):
        load_profile("jetson-orin-nano-8gb").tier("device")
    assert p.headroom_bytes(p.usable_bytes) == 0 and p.headroom_bytes(p.usable_bytes + 1) == -1
    assert p.compute.peak_tflops.get("fp16") == 165.2
    with pytest.raises(KeyError):
        p.compute.peak_tflops.get("fp12")


def test_to_json_round_trips_through_json() -> None:
    for p in list_profiles():
        data = json.loads(json.dumps(p.to_json()))
        assert data["id"] == p.id
        ram = p.total_memory_bytes - p.os_reserved_bytes
        assert data["usable_bytes"] == (min(ram, p.limit.bytes) if p.limit else ram)
        assert [t["name"] for t in data["tiers"]] == [t.name for t in p.tiers]


# -- loading user files ------------------------------------------------------------------------------


def test_user_file_loads_and_edits_apply(tmp_path: Path) -> None:
    text = set_line(builtin_text("iphone-15-pro"), "app_bytes", str(3 * GIB))  # a per-app limit measured on a device
    p = load_profile(write(tmp_path, text))
    assert p.usable_bytes == 3 * GIB
    assert p.source == str(tmp_path / "mine.toml")
    assert load_profile(tmp_path / "mine.toml") == p  # a Path works as well as a str


def test_unknown_id_lists_the_valid_ones() -> None:
    with pytest.raises(InputError) as exc:
        load_profile("jetson-orin-nano-4gb")
    msg = str(exc.value)
    assert "unknown device 'jetson-orin-nano-4gb'" in msg
    for ident in devices.builtin_ids():
        assert ident in msg


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_profile(str(tmp_path / "absent.toml"))
    with pytest.raises(InputError, match="not a regular file"):
        load_profile(tmp_path)
    with pytest.raises(InputError, match="cannot read"):
        load_profile("bad\x00name.toml")


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "x"\nid = \n')
    with pytest.raises(InputError, match=rf"{re.escape(str(path))}: not valid TOML"):
        load_profile(path)


def test_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = write(tmp_path, b"# " + b"x" * (10 << 20) + b"\n")  # 10 MiB of comment: valid TOML, too big
    with pytest.raises(InputError, match="at most 1048576 bytes"):
        load_profile(path)
    with pytest.raises(InputError, match="at most"):
        parse_profile(b" " * (devices.MAX_FILE_BYTES + 1))


@pytest.mark.parametrize("field", devices._TOP_REQUIRED)
def test_missing_top_level_field(tmp_path: Path, field: str) -> None:
    text = builtin_text("a100-80gb")
    tables = {
        "tiers": r"^\[\[tiers\]\]\n(.*\n)*?(?=\[compute\])",
        "compute": r"^\[compute\]\n(.*\n)*?(?=\[telemetry\])",
    }
    tables["telemetry"] = r"^\[telemetry\]\n(.*\n)*"
    text = re.sub(tables[field], "", text, flags=re.MULTILINE) if field in tables else drop_line(text, field)
    with pytest.raises(InputError, match=rf"mine\.toml: the top level: missing field {field}"):
        load_profile(write(tmp_path, text))


@pytest.mark.parametrize(
    ("key", "value", "occurrence", "message"),
    [
        (
            "total_memory_bytes",
            '"80GB"',
            0,
            r"total_memory_bytes: expected a whole number of bytes, got a string \('80GB'\)",
        ),
        ("total_memory_bytes", "-1", 0, r"total_memory_bytes: -1 is outside the plausible range"),
        ("total_memory_bytes", "80.0", 0, r"total_memory_bytes: expected a whole number of bytes, got a float"),
        ("total_memory_bytes", "true", 0, r"total_memory_bytes: expected a whole number of bytes, got a boolean"),
        ("total_memory_bytes", "85899345920000000", 0, r"total_memory_bytes: .* outside the plausible range"),
        ("os_reserved_bytes", "-536870912", 0, r"os_reserved_bytes: -536870912 is outside"),
        ("os_reserved_bytes", "85899345920", 0, r"os_reserved_bytes: 85899345920 leaves nothing"),
        ("unified_memory", '"no"', 0, r"unified_memory: expected true or false, got a string"),
        ("kind", '"toaster"', 0, r"kind: 'toaster' is not one of phone, sbc"),
        ("id", '"../../etc/passwd"', 0, r"id: '../../etc/passwd' must be lowercase"),
        ("name", '""', 0, r"name: expected 1 to 120 printable characters"),
        ("capacity_bytes", "-85899345920", 0, r"tiers\[0\]\.capacity_bytes: -85899345920 is outside"),
        ("capacity_bytes", "1", 0, r"tiers\[0\]\.capacity_bytes: 1 differs from total_memory_bytes"),
        ("bandwidth_gbps", '"fast"', 1, r"tiers\[1\]\.bandwidth_gbps: expected a number, got a string \('fast'\)"),
        ("bandwidth_gbps", "-32.0", 1, r"tiers\[1\]\.bandwidth_gbps: -32\.0 is outside the plausible range"),
        ("bandwidth_gbps", "nan", 0, r"tiers\[0\]\.bandwidth_gbps: nan is outside"),
        ("bandwidth_gbps", "inf", 0, r"tiers\[0\]\.bandwidth_gbps: inf is outside"),
        ("bandwidth_gbps", "2039e9", 0, r"tiers\[0\]\.bandwidth_gbps: .* outside the plausible range"),
        ("latency_us", "0", 2, r"tiers\[2\]\.latency_us: 0 is outside"),
        ("latency_us", "[0.5]", 0, r"tiers\[0\]\.latency_us: expected a number, got an array"),
        ("name", '"vram"', 1, r"tiers\[0\]\.name: 'vram' is not one of device, host, disk"),
        ("name", '"host"', 1, r"tiers\[1\]\.name: a second 'host' tier"),
        ("accelerators", '["cuda", "warp-drive"]', 0, r"compute\.accelerators\[1\]: 'warp-drive' is not one of"),
        ("accelerators", '"cuda"', 0, r"compute\.accelerators: expected an array of strings, got a string"),
        ("fp32", '"19.5 TFLOPS"', 0, r"compute\.peak_tflops\.fp32: expected a number, got a string"),
        ("fp32", "-19.5", 0, r"compute\.peak_tflops\.fp32: -19\.5 is outside"),
        ("sources", '["nvml", "nvml"]', 0, r"telemetry\.sources: lists an entry twice"),
        ("sources", '["smoke_signals"]', 0, r"telemetry\.sources\[0\]: 'smoke_signals' is not one of"),
    ],
)
def test_wrong_values_name_the_field(tmp_path: Path, key: str, value: str, occurrence: int, message: str) -> None:
    text = set_line(builtin_text("a100-80gb"), key, value, occurrence=occurrence)
    with pytest.raises(InputError, match=rf"mine\.toml: (?:{message})"):
        load_profile(write(tmp_path, text))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.replace('name = "NVIDIA A100 80GB SXM"', 'name = "A100"\nos_reserve_bytes = 1'),
            r"the top level: unknown field os_reserve_bytes",
        ),
        (lambda t: t.replace("fp64 = 19.5", "fp12 = 1.0"), r"compute\.peak_tflops: unknown field fp12"),
        (
            lambda t: t.replace("unified_memory = false", "unified_memory = true"),
            r"tiers: unified_memory = true but a separate 'device' tier",
        ),
        (
            lambda t: t.replace('name = "device"', 'name = "disk"', 1).replace(
                'name = "disk"\ncapacity_bytes = 30', 'name = "host"\ncapacity_bytes = 30'
            ),
            r"tiers\[2\]\.name: a second 'host' tier",
        ),
        (lambda t: t.replace("[telemetry]", "[telemetry]\nextra = 1"), r"telemetry: unknown field extra"),
        (
            lambda t: t.replace(
                "[compute.peak_tflops]",
                '[[compute.units]]\nname = "x"\nkind = "npu"\n[compute.units.peak_tflops]\nint8 = 1.0\n[compute.peak_tflops]',
            ),
            None,
        ),
        (
            lambda t: t + '\n[[tiers]]\nname = "disk"\ncapacity_bytes = 1\nbandwidth_gbps = 1.0\nlatency_us = 1.0\n',
            r"tiers: 4 tiers; at most one each",
        ),
        (
            lambda t: t.replace("id = ", "created = 1979-05-27T07:32:00Z\nid = "),
            r"the top level: unknown field created",
        ),
        (lambda t: t.replace('id = "a100-80gb"', "id = 1979-05-27"), r"id: expected a string, got a date"),
    ],
)
def test_schema_violations(tmp_path: Path, edit, message: str | None) -> None:
    text = edit(builtin_text("a100-80gb"))
    if message is None:  # the control: a well-formed extra unit loads
        assert load_profile(write(tmp_path, text)).compute.units[0].kind == "npu"
        return
    with pytest.raises(InputError, match=rf"mine\.toml: {message}"):
        load_profile(write(tmp_path, text))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe name = 1", r"not UTF-8 text"),
        (b"a = " + b"[" * 5000 + b"]" * 5000, r"not valid TOML"),  # recursion depth
        (b"a = " + b"9" * 5000, r"not (a usable TOML value|valid TOML)"),  # past Python's int-conversion digit limit
        (b"a = 1\x00", r"not valid TOML"),
        (b"", r"the top level: missing fields"),
        (b"[[tiers]]\n" * 3, r"the top level: missing fields"),
    ],
)
def test_hostile_bytes(data: bytes, message: str) -> None:
    with pytest.raises(InputError, match=rf"hostile\.toml: {message}"):
        parse_profile(data, label="hostile.toml")


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=4096))
def test_random_bytes_raise_only_input_error(fuzz_dir: Path, data: bytes) -> None:
    path = write(fuzz_dir, data, "random.toml")
    try:
        load_profile(path)
    except InputError:
        pass


TOML_SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=20).map(lambda s: json.dumps(s)),
    st.sampled_from(["true", "false", "[]", "{}", "[1, 2]", '["cuda"]', "1979-05-27", "{a = 1}", "[[1]]"]),
)


@settings(max_examples=300, deadline=None)
@given(
    ident=st.sampled_from(devices.builtin_ids()),
    line_index=st.integers(min_value=0, max_value=200),
    value=TOML_SCALARS,
)
def test_mutated_profiles_load_or_raise_input_error(ident: str, line_index: int, value: str) -> None:
    """Replace one `key = value` line of a real profile by an arbitrary TOML value: valid or InputError."""
    lines = builtin_text(ident).splitlines()
    assignments = [i for i, line in enumerate(lines) if re.match(r"^[A-Za-z0-9_]+ = ", line)]
    i = assignments[line_index % len(assignments)]
    key = lines[i].split(" = ", 1)[0]
    lines[i] = f"{key} = {value}"
    try:
        profile = parse_profile("\n".join(lines).encode(), label="mutated.toml")
    except InputError as exc:
        assert str(exc).startswith("mutated.toml: ")
    else:
        assert 0 < profile.usable_bytes <= profile.total_memory_bytes


# -- the command -----------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memwarden")
    devices_command.register(p.add_subparsers(dest="command"))
    return p


def test_command_json_lists_every_device(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["devices", "--json"])
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    listed = data["devices"]
    assert len(listed) >= 12
    assert {d["id"] for d in listed} == set(devices.builtin_ids())
    assert [d["usable_bytes"] for d in listed] == sorted(d["usable_bytes"] for d in listed)
    for d in listed:
        assert d["usable_bytes"] < d["total_memory_bytes"]


def test_command_table_and_one_profile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert devices_command.run(argparse.Namespace(json=False, profile=None)) == 0
    out = capsys.readouterr().out
    assert "jetson-orin-nano-8gb" in out and "h200-141gb" in out
    path = write(tmp_path, builtin_text("jetson-orin-nx-16gb"))
    args = parser().parse_args(["devices", str(path)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "Memory tiers" in out and "NVDLA" in out
    args = parser().parse_args(["devices", "--json", "t4-16gb" if "t4-16gb" in devices.builtin_ids() else "l4-24gb"])
    assert args.func(args) == 0
    assert len(json.loads(capsys.readouterr().out)["devices"]) == 1


def test_command_reports_bad_profile_as_input_error(tmp_path: Path) -> None:
    path = write(tmp_path, "total_memory_bytes = 'lots'\n")
    args = parser().parse_args(["devices", str(path)])
    with pytest.raises(InputError, match="mine.toml"):
        args.func(args)


def test_through_the_cli_entry_point(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With "devices" in cli.COMMANDS, a bad profile is one error line and exit status 2."""
    from memwarden import cli

    if "devices" not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, "devices"])
    assert cli.main(["devices", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["devices"]) >= 12
    assert cli.main(["devices", str(write(tmp_path, "id = 'x'\n"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memwarden devices: error: ") and "missing fields" in err[0]
    assert cli.main(["devices", "no-such-board"]) == 2
    assert "built-in devices: " in capsys.readouterr().err


# -- the limit that kills ----------------------------------------------------------------------------


def test_kill_limits_cover_iphones_android_phones_and_jetsons() -> None:
    kinds: dict[str, list[str]] = {}
    for ident in devices.builtin_ids():
        p = load_profile(ident)
        if p.limit is not None:
            kinds.setdefault(p.limit.kind, []).append(ident)
            assert p.limit.source and p.usable_bytes <= p.total_memory_bytes - p.os_reserved_bytes
    assert len(kinds["ios-jetsam"]) >= 2 and len(kinds["android-lmkd"]) >= 2 and len(kinds["jetson-gpu-share"]) >= 2


def test_ios_entitlement_raises_the_limit() -> None:
    plain, entitled = load_profile("iphone-15-pro"), load_profile("iphone-15-pro:entitled")
    assert plain.limit is not None and entitled.limit is not None
    assert plain.usable_bytes == plain.limit.app_bytes < entitled.usable_bytes
    assert entitled.id == "iphone-15-pro-entitled" and entitled.limit.entitled
    with pytest.raises(InputError, match="entitled"):
        load_profile("jetson-orin-nano-8gb:entitled")


def test_verdict_fits_the_ram_but_not_the_kill_limit() -> None:
    from memwarden.estimation.build import limit_verdict

    p = load_profile("iphone-15-pro")
    assert p.limit is not None
    peak = (p.limit.bytes + p.ram_bytes) // 2  # above the jetsam limit, below what iOS leaves
    v = limit_verdict(peak, p)
    assert v is not None and v["killed_below_ram"] and "jetsam" in v["kind"] and v["bytes"] == p.usable_bytes
    below = limit_verdict(p.limit.bytes - 1, p)
    assert below is not None and not below["killed_below_ram"]
