"""Hostile ONNX models and feeds (an attacker's campaign, one test each, and a short run of
benchmarks/bench_fuzz_onnx.py): each gets one error line and a non-zero exit, bounded in time and
memory, with no traceback, no escape sequence on the terminal and no temporary folder left."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from memwarden.cli import main
from memwarden.record.onnx.feeds import feed_headers, load_feeds, save_feeds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_fuzz_onnx as hostile  # noqa: E402

PROFILE = "iphone-15-pro"


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    status = main(argv)
    err = capsys.readouterr().err
    assert status not in (0, None), err
    assert "Traceback" not in err and "\x1b" not in err
    lines = [line for line in err.strip().splitlines() if not line.startswith("memwarden: ")]
    assert len(lines) == 1, err
    return lines[0]


def limited_cli(
    args: list[str], *, mem_gib: float = 1.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess under an address-space limit (what the campaign's "1 GB" means: the
    command must not need more). No time limit is asserted; the subprocess timeout only stops a hang."""

    def limit() -> None:
        cap = int(mem_gib * 1024**3) + 2 * 1024**3  # + the interpreter's, numpy's and ORT's mappings
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return subprocess.run(
        [sys.executable, "-m", "memwarden.cli", *args],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env=env,
    )


# -- 1. declared shapes against the machine, before inference or ORT -------------------------------


@pytest.mark.parametrize("n", [1 << 27, 1 << 40])
def test_constant_of_shape_bomb_is_refused_before_inference(tmp_path: Path, n: int) -> None:
    model = tmp_path / "cos.onnx"
    onnx.save(hostile.constant_of_shape_model(n), str(model))
    assert model.stat().st_size < 200
    done = limited_cli(["partition", str(model), "--device-profile", PROFILE])
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "bad_alloc" not in done.stderr
    assert done.stderr.count("\n") == 1 and "ConstantOfShape" in done.stderr and "bytes, over the limit" in done.stderr


def test_constant_of_shape_bomb_never_reaches_ort(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "cos.onnx"
    onnx.save(hostile.constant_of_shape_model(1 << 40), str(model))
    feeds = tmp_path / "f.npz"
    save_feeds(feeds, {})
    line = one_error_line(
        ["trace", "--onnx", str(model), "--inputs", str(feeds), "-o", str(tmp_path / "o.mwtrace")], capsys
    )
    assert "ConstantOfShape" in line or "holds no arrays" in line


# -- 2. control flow without a bound --------------------------------------------------------------


@pytest.mark.parametrize("trips", [1 << 62, None])
def test_unbounded_loop_is_stopped_and_leaves_no_temp_folder(tmp_path: Path, trips: int | None) -> None:
    model = tmp_path / "loop.onnx"
    onnx.save(hostile.loop_model(trips), str(model))
    feeds = {"x": np.ones(1, dtype=np.float32)} | ({} if trips else {"M": np.array(1 << 62, dtype=np.int64)})
    save_feeds(tmp_path / "f.npz", feeds)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "o.mwtrace"
    env = dict(os.environ, TMPDIR=str(tmp))
    done = limited_cli(
        ["trace", "--onnx", str(model), "--inputs", str(tmp_path / "f.npz"), "-o", str(out), "--loop-timeout", "1"],
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Loop '/loop/Loop' did not finish within 1 s" in done.stderr
    assert not out.exists()
    assert [p.name for p in tmp.iterdir() if p.name != ".ses"] == []  # .ses: onnxruntime's own, at import


def test_bounded_loop_runs(tmp_path: Path) -> None:
    model = tmp_path / "loop.onnx"
    onnx.save(hostile.loop_model(10), str(model))
    save_feeds(tmp_path / "f.npz", {"x": np.ones(1, dtype=np.float32)})
    assert (
        main(["trace", "--onnx", str(model), "--inputs", str(tmp_path / "f.npz"), "-o", str(tmp_path / "o.mwtrace")])
        == 0
    )


def test_loop_with_input_trip_count_runs_under_limits_when_it_ends(tmp_path: Path) -> None:
    model = tmp_path / "loop.onnx"
    onnx.save(hostile.loop_model(None), str(model))
    save_feeds(tmp_path / "f.npz", {"x": np.ones(1, dtype=np.float32), "M": np.array(5, dtype=np.int64)})
    out = tmp_path / "o.mwtrace"
    assert (
        main(
            [
                "trace",
                "--onnx",
                str(model),
                "--inputs",
                str(tmp_path / "f.npz"),
                "-o",
                str(out),
                "--arena",
                "off",
                "--loop-timeout",
                "120",
            ]
        )
        == 0
    )
    assert out.stat().st_size > 0


# -- 3. feeds --------------------------------------------------------------------------------------


def test_npz_bomb_is_refused_from_its_header(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.npz"
    bomb.write_bytes(hostile.npz_bomb(1 << 28))  # 1 GiB of zeros in about 1 MB
    assert bomb.stat().st_size < 2 * 1024**2
    model = tmp_path / "m.onnx"
    onnx.save(hostile.tiny_model(), str(model))
    for args in (
        ["trace", "--onnx", str(model), "--inputs", str(bomb), "-o", str(tmp_path / "o.mwtrace")],
        ["partition", str(model), "--device-profile", PROFILE, "--inputs", str(bomb)],
    ):
        done = limited_cli(args, mem_gib=0.5)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "over the 268,435,456-byte limit for feeds" in done.stderr


def test_npy_as_inputs_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "x.npy", np.ones((2, 4), dtype=np.float32))
    model = tmp_path / "m.onnx"
    onnx.save(hostile.tiny_model(), str(model))
    line = one_error_line(
        ["trace", "--onnx", str(model), "--inputs", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.mwtrace")], capsys
    )
    assert "a single .npy array" in line


@pytest.mark.parametrize("arena", ["on", "off"])
def test_input_named_file(tmp_path: Path, arena: str) -> None:
    model = hostile.tiny_model()
    model.graph.input[0].name = "file"
    model.graph.node[0].input[0] = "file"
    onnx.save(model, str(tmp_path / "m.onnx"))
    save_feeds(tmp_path / "f.npz", {"file": np.ones((2, 4), dtype=np.float32)})
    assert np.load(tmp_path / "f.npz")["file"].shape == (2, 4)  # numpy reads what save_feeds wrote
    argv = [
        "trace",
        "--onnx",
        str(tmp_path / "m.onnx"),
        "--inputs",
        str(tmp_path / "f.npz"),
        "-o",
        str(tmp_path / "o.mwtrace"),
        "--arena",
        arena,
    ]
    assert main(argv) == 0


def test_feed_headers_read_no_data(tmp_path: Path) -> None:
    save_feeds(tmp_path / "f.npz", {"x": np.zeros((3, 5), dtype=np.float16), "y": np.array(7)})
    assert feed_headers(tmp_path / "f.npz") == {"x": (np.dtype("float16"), (3, 5)), "y": (np.dtype("int64"), ())}
    assert load_feeds(tmp_path / "f.npz")["y"].shape == ()


def _no_data_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any array's data is read (only headers may be)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a feed's data was read")

    monkeypatch.setattr(np.lib.format, "read_array", refuse)


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (
            np.zeros((2, 4, 1024, 128), dtype=np.float32),
            "has shape (2, 4, 1024, 128); the model's input is ('batch', 4)",
        ),
        (np.zeros((2, 3), dtype=np.float32), "has shape (2, 3); the model's input is ('batch', 4)"),
        (np.zeros((2, 4), dtype=np.int64), "is int64; the model's input is float32"),
    ],
)
def test_trace_refuses_a_feed_the_model_cannot_take_before_inflating_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    array: np.ndarray,
    match: str,
) -> None:
    """trace --onnx --inputs compares each member's npy header with the model's inputs before its
    data is inflated (it inflated up to 256 MiB first, then compared)."""
    onnx.save(hostile.tiny_model(), str(tmp_path / "m.onnx"))
    (tmp_path / "f.npz").write_bytes(hostile.npz_bytes({"x.npy": hostile.npy_bytes(array)}, compress=True))
    _no_data_read(monkeypatch)
    line = one_error_line(
        [
            "trace",
            "--onnx",
            str(tmp_path / "m.onnx"),
            "--inputs",
            str(tmp_path / "f.npz"),
            "-o",
            str(tmp_path / "o.mwtrace"),
        ],
        capsys,
    )
    assert match in line and "f.npz: array 'x'" in line
    assert not (tmp_path / "o.mwtrace").exists()


def test_trace_refuses_an_oversized_feed_from_its_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member whose header declares more than the feeds limit is refused from the header alone."""
    import io

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False, "shape": (1 << 38, 4)})
    onnx.save(hostile.tiny_model(), str(tmp_path / "m.onnx"))
    (tmp_path / "f.npz").write_bytes(hostile.npz_bytes({"x.npy": head.getvalue() + bytes(64)}))
    _no_data_read(monkeypatch)
    for argv in (
        ["trace", "--onnx", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.mwtrace")],
        ["partition", str(tmp_path / "m.onnx"), "--device-profile", PROFILE],
    ):
        line = one_error_line([*argv, "--inputs", str(tmp_path / "f.npz")], capsys)
        assert "over the 268,435,456-byte limit for feeds" in line


def test_load_feeds_checks_names_against_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memwarden.errors import InputError

    save_feeds(tmp_path / "f.npz", {"x": np.ones((2, 4), dtype=np.float32), "extra": np.zeros(3)})
    _no_data_read(monkeypatch)
    with pytest.raises(InputError, match=r"missing \['y'\], unexpected \['extra'\]"):
        load_feeds(tmp_path / "f.npz", inputs={"x": (1, ("batch", 4)), "y": (7, None)})


def test_load_shaped_names_a_hostile_feed_terminal_safe(tmp_path: Path) -> None:
    """fuzz feeds seed 35 (--full-every reader): a feed named with escape sequences reached
    ``load_shaped``'s error text raw (the partition command checks names first; the API did not)."""
    from memwarden.errors import InputError
    from memwarden.plan.partition_shapes import load_shaped

    onnx.save(hostile.tiny_model(), str(tmp_path / "m.onnx"))
    for kwargs in ({"input_shapes": {hostile.ESC: (2, 4)}}, {"dims": {hostile.ESC + "\n[red]": 2}}):
        with pytest.raises(InputError) as info:
            load_shaped(tmp_path / "m.onnx", **kwargs)  # type: ignore[arg-type]
        assert "\x1b" not in str(info.value) and "\n" not in str(info.value)


# -- 4. external data ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dims", "location", "match"),
    [
        ([-1, 10**9], "w.bin", "dimension -1 is negative"),
        ([10**9, 3], "w.bin", "holds 64 bytes; the tensor needs"),
        ([4, 3], "../w.bin", "inside the model's folder"),
        ([4, 3], "missing.bin", "no such file"),
    ],
)
def test_external_initializer_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dims: list[int], location: str, match: str
) -> None:
    model = hostile.external_model(tmp_path, dims, location=location, data=None if "missing" in location else bytes(64))
    line = one_error_line(["partition", str(model), "--device-profile", PROFILE, "--json"], capsys)
    assert match in line


def test_external_initializer_that_exists_is_costed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = hostile.external_model(tmp_path, [4, 3], data=bytes(48))
    assert main(["partition", str(model), "--device-profile", PROFILE, "--json"]) == 0
    assert '"feasible": true' in capsys.readouterr().out


# -- 7. escape sequences ---------------------------------------------------------------------------


def test_node_names_never_reach_the_terminal_raw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    onnx.save(hostile.named_model("/a" + hostile.ESC + "[red]x[/red]/MatMul"), str(tmp_path / "m.onnx"))
    assert main(["partition", str(tmp_path / "m.onnx"), "--device-profile", PROFILE]) == 0
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out + captured.err
    bad = tmp_path / ("\x1b]0;title\x07" + "m.onnx")
    bad.write_bytes(b"junk")
    line = one_error_line(["partition", str(bad), "--device-profile", PROFILE], capsys)
    assert "\\x1b]0;title\\x07" in line


def test_compare_shows_trace_names_safely(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    onnx.save(hostile.named_model("/mod" + hostile.ESC + "<script>x</script>/MatMul"), str(tmp_path / "m.onnx"))
    save_feeds(tmp_path / "f.npz", hostile.tiny_feeds())
    trace = tmp_path / "t.mwtrace"
    assert (
        main(["trace", "--onnx", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "f.npz"), "-o", str(trace)]) == 0
    )
    capsys.readouterr()
    assert main(["compare", str(trace), str(trace), "--module-depth", "8"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    page = tmp_path / "c.html"
    assert main(["compare", str(trace), str(trace), "--html", str(page), "--module-depth", "8"]) == 0
    html = page.read_text()
    assert "\x1b" not in html and "<script>" not in html


# -- 8. FIFOs ----------------------------------------------------------------------------------------


def test_fifo_in_place_of_model_or_feeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    model = tmp_path / "m.onnx"
    onnx.save(hostile.tiny_model(), str(model))
    save_feeds(tmp_path / "f.npz", hostile.tiny_feeds())
    out = str(tmp_path / "o.mwtrace")
    for argv in (
        ["partition", str(fifo), "--device-profile", PROFILE],
        ["partition", str(model), "--device-profile", PROFILE, "--inputs", str(fifo)],
        ["trace", "--onnx", str(fifo), "--inputs", str(tmp_path / "f.npz"), "-o", out],
        ["trace", "--onnx", str(model), "--inputs", str(fifo), "-o", out],
    ):
        assert "not a regular file" in one_error_line(argv, capsys)
    hostile.external_model(tmp_path, [4, 3], location="fifo", data=b"")  # an initializer's data in the FIFO
    assert "not a regular file" in one_error_line(
        ["partition", str(tmp_path / "model.onnx"), "--device-profile", PROFILE], capsys
    )


# -- the fuzzer, a bounded budget ----------------------------------------------------------------------


def test_fuzz_campaign_short_run() -> None:
    summary = hostile.fuzz(120, ["onnx", "feeds", "checkpoint"], timeout_s=120, mem_cap_gib=3.0, seed=1000)
    assert summary["ok"], summary["findings"]
    for kind in ("onnx", "feeds", "checkpoint"):
        assert summary[kind]["cases"] == 40


def test_fuzz_campaign_reads_every_case_and_runs_a_sample() -> None:
    """--full-every K: every case through the readers in one worker, every K-th through the commands."""
    summary = hostile.fuzz(60, ["onnx", "feeds"], timeout_s=120, mem_cap_gib=3.0, seed=2000, full_every=10)
    assert summary["ok"], summary["findings"]
    assert summary["full_cases"] == 6
    for kind in ("onnx", "feeds"):
        assert summary[kind]["read"]["cases"] == 30 and summary[kind]["cases"] == 3


# -- what the fuzzer found ---------------------------------------------------------------------------


def test_node_name_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fuzz onnx seed 309: a flipped byte in a node name reached partition_onnx as bytes."""
    data = hostile.named_model("/mm/MatMulX").SerializeToString().replace(b"MatMulX", b"MatMul\xff")
    (tmp_path / "m.onnx").write_bytes(data)
    assert "not valid UTF-8" in one_error_line(
        ["partition", str(tmp_path / "m.onnx"), "--device-profile", PROFILE], capsys
    )


def test_corrupt_deflate_stream_in_feeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fuzz feeds seeds 1117/1243/1252: a damaged deflate stream raised zlib.error."""
    data = bytearray(hostile.npz_bytes({"x.npy": hostile.npy_bytes(np.arange(64.0))}, compress=True))
    data[40:48] = b"\xff" * 8  # inside the member's compressed data
    (tmp_path / "f.npz").write_bytes(bytes(data))
    onnx.save(hostile.tiny_model(), str(tmp_path / "m.onnx"))
    line = one_error_line(
        ["partition", str(tmp_path / "m.onnx"), "--device-profile", PROFILE, "--inputs", str(tmp_path / "f.npz")],
        capsys,
    )
    assert "f.npz" in line


@pytest.mark.parametrize("command", ["partition", "trace"])
def test_zip_version_beyond_python_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """fuzz feeds seeds 1491, 2357, 2605, ... (10,000-case run): a flipped byte in the central
    directory's "version needed to extract" made zipfile raise NotImplementedError."""
    data = bytearray(hostile.npz_bytes({"x.npy": hostile.npy_bytes(np.ones((2, 4), dtype=np.float32))}))
    entry = data.rindex(b"PK\x01\x02")  # the central directory's entry for x.npy
    data[entry + 6] = 85  # version needed to extract: 8.5, past what zipfile reads
    (tmp_path / "f.npz").write_bytes(bytes(data))
    onnx.save(hostile.tiny_model(), str(tmp_path / "m.onnx"))
    argv = {
        "partition": ["partition", str(tmp_path / "m.onnx"), "--device-profile", PROFILE],
        "trace": ["trace", "--onnx", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.mwtrace")],
    }[command]
    line = one_error_line([*argv, "--inputs", str(tmp_path / "f.npz")], capsys)
    assert "f.npz" in line and "zip file version 8.5" in line
