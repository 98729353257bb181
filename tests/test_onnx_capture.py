"""ONNX Runtime capture: zoo export, the capture's peak against ORT's own counters, and every
reader (summary, diagnose, report, replay, plan) on an ORT trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from memwarden.analyze.analysis import Analysis  # noqa: E402
from memwarden.cli import main  # noqa: E402
from memwarden.errors import InputError  # noqa: E402
from memwarden.record.onnx.capture import capture_onnx  # noqa: E402
from memwarden.record.onnx.export import example_feeds, export_zoo  # noqa: E402
from memwarden.record.onnx.graph import module_path_of  # noqa: E402
from memwarden.record.onnx.measure import ort_counter_peak, run_peak_bytes  # noqa: E402
from memwarden.record.onnx.session import OrtSettings  # noqa: E402
from memwarden.trace.io import load, save  # noqa: E402
from memwarden.trace.model import Category  # noqa: E402


@pytest.fixture(scope="session")
def zoo_onnx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    """``{"llava-vision": (path, feeds), ...}``: the tiny zoo VLMs exported once per session."""
    out = tmp_path_factory.mktemp("onnx")
    parts: dict[str, tuple[Path, dict[str, np.ndarray]]] = {}
    for name in ("llava", "qwen2-vl"):
        feeds = example_feeds(name)
        for part, path in export_zoo(name, out).items():
            parts[f"{name}-{part}"] = (path, feeds[part])
    return parts


def test_module_paths_from_node_names() -> None:
    assert (
        module_path_of("/vision_tower/encoder/layers.0/mlp/fc1/MatMul", "model.")
        == "model.vision_tower.encoder.layers.0.mlp.fc1"
    )
    assert module_path_of("/lm_head/MatMul", "model.", frozenset({"lm_head"})) == "lm_head"
    assert module_path_of("/language_model/layers.0/input_layernorm/Mul_1/SimplifiedLayerNormFusion/") == (
        "language_model.layers.0.input_layernorm"
    )
    assert module_path_of("MatMul_12") is None


def test_feeds_keep_no_torch_tensor_alive() -> None:
    """The feeds own their memory: a feed that viewed a torch tensor's storage would keep the tensor
    alive, and every later live capture in the process would count it (364 KB of Qwen2-VL inputs
    did, for a session-scoped fixture's feeds)."""
    import gc

    import torch

    def live_storages() -> set[int]:
        gc.collect()
        return {
            o.untyped_storage().data_ptr() for o in gc.get_objects() if isinstance(o, torch.Tensor) and not o.is_meta
        }

    before = live_storages()
    feeds = example_feeds("qwen2-vl")
    assert all(a.flags.owndata for part in feeds.values() for a in part.values())
    assert live_storages() <= before


def test_export_keeps_module_paths_and_modalities(zoo_onnx: dict) -> None:
    path, feeds = zoo_onnx["llava-vision"]
    trace = capture_onnx(path, feeds)
    modules = {trace.string(int(i)) for i in trace.events["module"] if i >= 0}
    assert any(m.startswith("model.vision_tower.encoder.layers.0") for m in modules)
    assert any(m.startswith("model.multi_modal_projector") for m in modules)
    s = Analysis(trace).summary
    assert set(s.weights_by_modality) >= {"vision", "fusion"}
    assert "encode" in s.by_phase_peak


@pytest.mark.parametrize(
    "part", ["llava-vision", "llava-prefill", "llava-decode", "qwen2-vl-vision", "qwen2-vl-prefill"]
)
@pytest.mark.parametrize("arena", [True, False], ids=["arena-on", "arena-off"])
def test_peak_within_5_percent_of_ort_counters(zoo_onnx: dict, part: str, arena: bool) -> None:
    path, feeds = zoo_onnx[part]
    trace = capture_onnx(path, feeds, settings=OrtSettings(arena=arena, mem_pattern=False))
    ours, ort = run_peak_bytes(trace), ort_counter_peak(trace)
    assert ort is not None and ort > 0
    assert abs(ours - ort) <= 0.05 * ort, (ours, ort)


def test_decode_has_kv_cache_and_phases(zoo_onnx: dict) -> None:
    path, feeds = zoo_onnx["qwen2-vl-decode"]
    trace = capture_onnx(path, [feeds, feeds])  # two runs: two decode steps
    cats = set(trace.events["category"].tolist())
    assert Category.KV_CACHE in cats and Category.WEIGHT in cats
    assert [s["phase"] for s in trace.metadata["steps"]] == ["decode", "decode"]
    assert len(trace.metadata["onnxruntime"]["runs"]) == 2
    assert int(trace.live_bytes()[-1]) == Analysis(trace).summary.weights_bytes  # every run-time block freed


def test_session_is_accepted(zoo_onnx: dict) -> None:
    import onnxruntime as ort

    path, feeds = zoo_onnx["llava-prefill"]
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = False
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    trace = capture_onnx(session, feeds)
    assert trace.metadata["onnxruntime"]["arena"] is False
    assert Analysis(trace).summary.peak_bytes > 0


def test_cli_trace_and_every_reader(zoo_onnx: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, feeds = zoo_onnx["llava-prefill"]
    npz = tmp_path / "feeds.npz"
    np.savez(npz, **feeds)
    out = tmp_path / "x.mwtrace"
    assert (
        main(
            [
                "trace",
                "--onnx",
                str(path),
                "--inputs",
                str(npz),
                "--arena",
                "off",
                "--mem-pattern",
                "off",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert load(out).metadata["capture"] == "onnxruntime"
    assert main(["summary", str(out)]) == 0
    assert main(["diagnose", str(out)]) == 0
    assert main(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
    assert main(["replay", str(out)]) == 0
    assert main(["plan", str(out)]) == 0
    capsys.readouterr()


def test_bad_inputs_fail_with_one_line(zoo_onnx: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, feeds = zoo_onnx["llava-vision"]
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a model" * 10)
    with pytest.raises(InputError):
        capture_onnx(junk, feeds)
    with pytest.raises(InputError, match="feeds do not match"):
        capture_onnx(path, {"nope": np.zeros(3, np.float32)})
    npz = tmp_path / "bad.npz"
    npz.write_bytes(b"PK junk")
    assert main(["trace", "--onnx", str(path), "--inputs", str(npz), "-o", str(tmp_path / "y.mwtrace")]) == 2
    err = capsys.readouterr().err
    assert "error" in err and len(err.strip().splitlines()) == 1


def test_trace_round_trips(zoo_onnx: dict, tmp_path: Path) -> None:
    path, feeds = zoo_onnx["llava-decode"]
    trace = capture_onnx(path, feeds)
    again = load(save(trace, tmp_path / "t.mwtrace"))
    assert np.array_equal(again.live_bytes(), trace.live_bytes())


def test_compare_pytorch_and_ort(zoo_onnx: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import torch

    from memwarden.record.api import capture
    from memwarden.record.onnx.export import export_parts

    module, inputs, _, _ = export_parts("llava", "tiny")["vision"]
    with torch.no_grad(), capture() as cap:
        module(*inputs)
    path, feeds = zoo_onnx["llava-vision"]
    a, b = tmp_path / "pt.mwtrace", tmp_path / "ort.mwtrace"
    save(cap.trace, a)
    save(capture_onnx(path, feeds), b)
    assert main(["compare", str(a), str(b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    sections = {row["section"] for row in data["rows"]}
    assert {"total", "category", "modality", "phase", "module"} <= sections
    assert "ORT cpu" in data["b"]
    assert main(["compare", str(a), str(b)]) == 0
    html = tmp_path / "c.html"
    assert main(["compare", str(a), str(b), "--html", str(html)]) == 0
    assert "<table" in html.read_text() and "vision" in html.read_text()
    capsys.readouterr()


def _synthetic_mlp(path: Path) -> dict[str, np.ndarray]:
    """A graph with MiB-sized tensors, so a malloc-level measurement is not drowned by the
    interpreter's own small allocations: X (512, 512) -> MatMul -> Relu -> MatMul -> + skip -> Softmax."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1, w2 = (numpy_helper.from_array(rng.random((512, 512), dtype=np.float32), name) for name in ("w1", "w2"))
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="/mlp/fc1/MatMul"),
        helper.make_node("Relu", ["a"], ["b"], name="/mlp/act/Relu"),
        helper.make_node("MatMul", ["b", "w2"], ["c"], name="/mlp/fc2/MatMul"),
        helper.make_node("Add", ["c", "a"], ["d"], name="/mlp/Add"),
        helper.make_node("Softmax", ["d"], ["y"], name="/head/Softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512, 512])],
        initializer=[w1, w2],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return {"x": rng.random((512, 512), dtype=np.float32)}


@pytest.mark.parametrize("arena", [True, False], ids=["arena-on", "arena-off"])
def test_peak_within_5_percent_of_memray(tmp_path: Path, arena: bool) -> None:
    pytest.importorskip("memray")
    from memwarden.record.onnx.measure import measure_run

    path = tmp_path / "mlp.onnx"
    feeds = _synthetic_mlp(path)
    settings = OrtSettings(arena=arena, mem_pattern=False)
    ours = run_peak_bytes(capture_onnx(path, feeds, settings=settings))
    measured = measure_run(path, feeds, OrtSettings(arena=False, mem_pattern=False)).memray_peak_bytes
    assert measured is not None
    assert abs(ours - measured) <= 0.05 * measured, (ours, measured)


def _malloc_counter() -> None:
    from memwarden.record.onnx import mallocpeak

    if mallocpeak.build() is None:
        pytest.skip("the malloc counter needs Linux with glibc and a C++ compiler")


@pytest.mark.parametrize("mem_pattern", [False, True], ids=["pattern-off", "pattern-on"])
def test_peak_within_5_percent_of_malloc_counter(tmp_path: Path, mem_pattern: bool) -> None:
    """Two runs in one session, arena off: the second run's capture peak against every byte the C
    library handed out during that run in a fresh process. With the memory pattern on, the second
    run holds ORT's pattern buffer (3 MiB here) and the graph output beside it: 4 MiB against the
    first run's 3 MiB, so a capture that ignored the pattern would be 25% short."""
    from memwarden.record.onnx.measure import measure_run, run_peaks

    _malloc_counter()
    path = tmp_path / "mlp.onnx"
    feeds = _synthetic_mlp(path)
    settings = OrtSettings(arena=False, mem_pattern=mem_pattern)
    peaks = run_peaks(capture_onnx(path, [feeds, feeds], settings=settings))
    measured = measure_run(path, feeds, settings, runs=2).malloc_peak_bytes
    assert measured is not None
    assert abs(peaks[1] - measured) <= 0.05 * measured, (peaks, measured)
    assert (peaks[1] > 1.2 * peaks[0]) == mem_pattern, peaks


def test_pattern_run_agrees_with_ort_counters(zoo_onnx: dict) -> None:
    """On a zoo graph with the memory pattern on, the second run's capture peak equals ORT's own
    requested bytes for that run (pattern buffer + outputs + what the kernels allocate outside it)."""
    from memwarden.record.onnx.measure import ort_runs, run_peaks

    path, feeds = zoo_onnx["qwen2-vl-vision"]
    trace = capture_onnx(path, [feeds, feeds], settings=OrtSettings(arena=True, mem_pattern=True))
    first, second = ort_runs(trace)
    ort = int(second["arena_in_use_peak_bytes"]) - int(first["arena_in_use_before_bytes"])
    ours = run_peaks(trace)[1]
    assert abs(ours - ort) <= 0.05 * ort, (ours, ort)
    assert int(trace.live_bytes()[-1]) == Analysis(trace).summary.weights_bytes  # the pattern block is freed


def test_pattern_planner_best_fit() -> None:
    from memwarden.record.onnx.pattern import pattern_bytes

    kib = 1024
    # a(4) b(2) c(4) at 0, 4, 6; a and c go; d(2) fits a's old place and the tail (6-10) with the
    # same waste: the first wins; e(4) then fits only the tail; f(8) goes on top: 10 + 8.
    trace = [
        (True, 1, 4 * kib),
        (True, 2, 2 * kib),
        (True, 3, 4 * kib),
        (False, 1, 0),
        (False, 3, 0),
        (True, 4, 2 * kib),
        (True, 5, 4 * kib),
        (True, 6, 8 * kib),
    ]
    assert pattern_bytes(trace) == 18 * kib
    # sizes round up to 64 B
    assert pattern_bytes([(True, 1, 1), (True, 2, 65)]) == 64 + 128
    # the tail above the last live block is reused before the buffer grows
    assert pattern_bytes([(True, 1, kib), (True, 2, kib), (False, 2, 0), (True, 3, kib)]) == 2 * kib


def test_malloc_counter_sees_every_byte(tmp_path: Path) -> None:
    """The preloaded counter against a known allocation: a 10 MB numpy array made and dropped."""
    import os
    import subprocess
    import sys

    from memwarden.record.onnx import mallocpeak

    _malloc_counter()
    library = mallocpeak.build()
    code = (
        "import numpy as np\n"
        "from memwarden.record.onnx import mallocpeak as m\n"
        "b = m.reset_peak()\n"
        "a = np.ones(10_000_000, dtype=np.uint8)\n"
        "del a\n"
        "print(m.read_peak() - b, m.read_live() - b)\n"
    )
    env = {**os.environ, "LD_PRELOAD": str(library)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    peak, live = map(int, done.stdout.split())
    assert 10_000_000 <= peak <= 10_000_000 + 64 * 1024
    assert abs(live) < 64 * 1024


def _rounded_scratch_graph(path: Path) -> dict[str, np.ndarray]:
    """Relu of a 6 MiB feed, its sum, then Where(cond, x, sum) with a 4 MiB output and a 4 MiB
    temporary. ORT's default arena serves the 6 MiB request from an 8 MiB region it does not split
    (a chunk under twice the request stays whole), and the Where's scratch then lifts the arena's
    high-water mark by 8 MiB, not 4."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["a"], ["b"], name="/act/Relu"),
        helper.make_node("ReduceSum", ["b"], ["s"], name="/sum/ReduceSum", keepdims=0),
        helper.make_node("Where", ["cond", "x", "s"], ["y"], name="/mask/Where"),
    ]
    inputs = [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"]),
        helper.make_tensor_value_info("cond", TensorProto.BOOL, [1]),
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m"]),
    ]
    graph = helper.make_graph(nodes, "where", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rng = np.random.default_rng(0)
    return {
        "a": rng.standard_normal(6 << 18, dtype=np.float32),
        "cond": np.array([True]),
        "x": rng.standard_normal(1 << 20, dtype=np.float32),
    }


def test_arena_off_scratch_is_not_rounded_to_arena_chunks(tmp_path: Path) -> None:
    """Arena off, the scratch comes from the arena-on twin's high-water mark. On ORT's default arena
    that mark counts whole chunks: the capture took 8 MiB of scratch for the Where's 4 MiB and was
    50% above the malloc counter. The twin runs on an arena that splits every chunk
    (``memwarden.record.onnx.twin``), in its own process, so sessions here keep the default."""
    import onnxruntime as ort

    from memwarden.record.onnx.measure import measure_run, run_peaks
    from memwarden.record.onnx.profile import read_profile

    _malloc_counter()
    path = tmp_path / "where.onnx"
    feeds = _rounded_scratch_graph(path)
    settings = OrtSettings(arena=False, mem_pattern=False)
    trace = capture_onnx(path, [feeds, feeds], settings=settings)
    ev = trace.events
    scratch = [
        int(n)
        for c, o, n in zip(ev["category"], ev["op"], ev["nbytes"], strict=True)
        if c == Category.TEMPORARY and trace.string(int(o)) == "Where"
    ]
    assert scratch and max(scratch) <= (4 << 20) + 256, scratch  # the request, not its 8 MiB chunk
    measured = measure_run(path, feeds, settings, runs=2).malloc_peak_bytes
    assert measured is not None
    ours = run_peaks(trace)[1]
    assert abs(ours - measured) <= 0.05 * measured, (ours, measured)
    # a session of this process that asks for the environment's allocators still gets the default
    # arena: the splitting one was registered in the twin's process only
    so = OrtSettings(arena=True, mem_pattern=False).session_options()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "own")
    so.add_session_config_entry("session.use_env_allocators", "1")
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    (run,) = read_profile(session.end_profiling())
    where = run.nodes[-1]
    assert where.in_use_peak_bytes is not None and where.in_use_bytes is not None
    assert where.in_use_peak_bytes - where.in_use_bytes > (6 << 20), (where.in_use_peak_bytes, where.in_use_bytes)
