"""Source lines for every byte, the growth pattern and traced vs resident memory (issue 25).

Scripts run through ``memwarden trace`` exactly as a user runs them. Crashes are deterministic: a
script flushes its stream (``memwarden.flush()``) before it is killed, and a kill from outside
waits on a file the script writes after its flush, never on a clock.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import memwarden

MIB = 1 << 20


def run_cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memwarden.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def _line_of(source: str, marker: str) -> int:
    return next(i for i, text in enumerate(source.splitlines(), 1) if marker in text)


PLANTED = textwrap.dedent(
    """
    import torch

    def load():
        return torch.zeros(8 << 20, dtype=torch.uint8)  # helper line

    model = torch.nn.Linear(256, 256)
    weights = load()
    held = torch.empty(48 << 20, dtype=torch.uint8)  # planted
    out = model(torch.randn(32, 256))
    """
)


def test_summary_names_the_planted_line(tmp_path: Path) -> None:
    script = tmp_path / "planted.py"
    script.write_text(PLANTED)
    out = tmp_path / "run.mwtrace"
    proc = run_cli("trace", "-o", str(out), str(script), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(run_cli("summary", "--json", str(out)).stdout)
    top = data["top_lines_at_peak"]
    assert set(top[0]) >= {"file", "line", "function", "nbytes"}
    assert Path(top[0]["file"]).name == "planted.py"
    assert top[0]["line"] == _line_of(PLANTED, "# planted") and top[0]["nbytes"] == 48 * MIB
    helper = next(x for x in top if x["line"] == _line_of(PLANTED, "# helper line"))
    assert helper["function"] == "load" and helper["nbytes"] == 8 * MIB
    # no line in torch or memwarden: only the script's own
    assert all(Path(x["file"]).name == "planted.py" for x in top)
    # the terminal summary shows the line too
    text = run_cli("summary", str(out)).stdout
    assert f"planted.py:{_line_of(PLANTED, '# planted')}" in text


def test_stacks_and_user_code_narrowing(tmp_path: Path) -> None:
    script = tmp_path / "planted.py"
    script.write_text(PLANTED)
    out = tmp_path / "run.mwtrace"
    assert run_cli("trace", "--stacks", "-o", str(out), str(script), cwd=str(tmp_path)).returncode == 0
    trace = memwarden.load(out)
    stacks = {trace.strings[s] for s in trace.events["stack"].tolist() if s >= 0}
    helper_line = _line_of(PLANTED, "# helper line")
    caller = _line_of(PLANTED, "weights = load()")
    assert any(f"planted.py:{helper_line}:load\n" in s and f"planted.py:{caller}:<module>" in s for s in stacks)
    # The script counted as a library: no line of it is the user's any more.
    out2 = tmp_path / "narrow.mwtrace"
    assert (
        run_cli("trace", "--library-code", str(tmp_path), "-o", str(out2), str(script), cwd=str(tmp_path)).returncode
        == 0
    )
    assert json.loads(run_cli("summary", "--json", str(out2)).stdout)["top_lines_at_peak"] == []


def test_in_process_capture_lines() -> None:
    import torch

    with memwarden.capture() as cap:
        kept = torch.ones(3 << 20, dtype=torch.uint8)  # in-process planted
    trace = cap.trace
    lines = {trace.strings[i] for i in trace.events["line"].tolist() if i >= 0}
    here = _line_of(Path(__file__).read_text(), "# in-process planted")
    assert any(s.endswith(f"test_lines.py:{here}:test_in_process_capture_lines") for s in lines), lines
    del kept
    with memwarden.capture(lines=False) as cap2:
        torch.ones(1024)
    assert (cap2.trace.events["line"] == -1).all()


def test_torch_snapshot_frames_shown_by_memory_viz(tmp_path: Path) -> None:
    script = tmp_path / "planted.py"
    script.write_text(PLANTED)
    out = tmp_path / "run.mwtrace"
    assert run_cli("trace", "-o", str(out), str(script), cwd=str(tmp_path)).returncode == 0
    snap = tmp_path / "snap.pickle"
    assert run_cli("export", "--format", "torch-snapshot", "-o", str(snap), str(out)).returncode == 0
    html = tmp_path / "plot.html"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(snap), "-o", str(html)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    # The page embeds what it shows: the snapshot, base64-encoded, whose frames the viewer prints.
    encoded = re.search(r'"base64": "([^"]+)"', html.read_text())
    assert encoded is not None
    shown = pickle.loads(base64.b64decode(encoded.group(1)))
    frames = [f for trace in shown["device_traces"] for e in trace for f in e["frames"]]
    planted = _line_of(PLANTED, "# planted")
    assert any(f["filename"].endswith("planted.py") and f["line"] == planted for f in frames)


GROWTH = textwrap.dedent(
    """
    import collections, os, sys, time
    import torch
    import memwarden

    mode, marker = sys.argv[1], sys.argv[2]
    kept = []
    bounded = collections.deque(maxlen=3)
    for i in range(60):
        scratch = torch.randn(1 << 14)  # freed every iteration
        block = torch.ones(1 << 18, dtype=torch.uint8)  # the growing line
        if mode == "grow" or (mode == "warmup" and i < 3):
            kept.append(block)
        elif mode == "bounded":
            bounded.append(block)
    for _ in range(3):  # the steady state the kill interrupts, in the trace whenever the kill comes
        kept.append(torch.ones(1 << 18, dtype=torch.uint8)) if mode == "grow" else torch.ones(1 << 18)
    assert memwarden.flush()
    Path = __import__("pathlib").Path
    Path(marker + ".tmp").write_text(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    while True:  # keeps going until killed from outside
        kept.append(torch.ones(1 << 18, dtype=torch.uint8)) if mode == "grow" else torch.ones(1 << 18)
        time.sleep(0.01)
    """
)


def _grow_until_killed(tmp_path: Path, mode: str) -> tuple[Path, dict[str, object]]:
    script = tmp_path / f"{mode}.py"
    script.write_text(GROWTH)
    out, marker = tmp_path / f"{mode}.mwtrace", tmp_path / f"{mode}.ready"
    cmd = [sys.executable, "-m", "memwarden.cli", "trace", "-o", str(out), str(script), mode, str(marker)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not marker.exists():  # written after the flush: waiting is on the file, not a clock
            assert proc.poll() is None, proc.communicate()
            os.sched_yield()
        os.kill(int(marker.read_text()), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL, stderr
    return out, json.loads(run_cli("diagnose", "--json", str(out)).stdout)


def test_growth_until_killed_names_the_line(tmp_path: Path) -> None:
    out, data = _grow_until_killed(tmp_path, "grow")
    growth = [f for f in data["findings"] if f["pattern"] == "unbounded-growth"]  # type: ignore[union-attr]
    assert len(growth) == 1
    f = growth[0]
    line = _line_of(GROWTH, "# the growing line")
    assert f["lines"][0]["line"] == line and Path(f["lines"][0]["file"]).name == "grow.py"
    assert f["evidence"]["growth_per_iteration_bytes"] == 1 << 18
    assert f["evidence"]["iterations"] >= 60
    assert f"grow.py:{line}" in f["fix"]
    # every finding names lines in the {file, line, nbytes} shape
    assert all(set(x) == {"file", "line", "nbytes"} for g in data["findings"] for x in g["lines"])  # type: ignore[union-attr]


def test_plateau_and_bounded_cache_are_not_growth(tmp_path: Path) -> None:
    for mode in ("warmup", "bounded"):
        _, data = _grow_until_killed(tmp_path, mode)
        assert not [f for f in data["findings"] if f["pattern"] == "unbounded-growth"], (mode, data)  # type: ignore[union-attr]


NATIVE = textwrap.dedent(
    """
    import os, signal
    import numpy as np
    import torch
    import memwarden

    native = np.ones(96 << 20, dtype=np.uint8)  # numpy: memory the trace cannot see
    traced = torch.ones(16 << 20, dtype=torch.uint8)
    assert memwarden.flush()  # samples the process's resident size into the stream
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_traced_against_resident_with_native_memory(tmp_path: Path) -> None:
    script = tmp_path / "native.py"
    script.write_text(NATIVE)
    out = tmp_path / "run.mwtrace"
    proc = run_cli("trace", "-o", str(out), str(script), cwd=str(tmp_path))
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    data = json.loads(run_cli("summary", "--json", str(out)).stdout)
    res = data["resident"]
    assert res["samples"] >= 1
    assert res["traced_at_rss_peak_bytes"] >= 16 * MIB
    assert res["not_traced_bytes"] >= 96 * MIB  # numpy's array, labelled as not traced
    assert res["peak_rss_bytes"] == res["traced_at_rss_peak_bytes"] + res["not_traced_bytes"]
    text = run_cli("summary", str(out)).stdout
    assert "not traced" in text
    html = tmp_path / "report.html"
    assert run_cli("report", "-o", str(html), str(out)).returncode == 0
    assert "not traced" in html.read_text()


# -- the script's line for blocks a user-defined model allocates ---------------------------------


class _UserModel:
    """Built lazily: torch is imported by the tests that use it."""

    @staticmethod
    def make():  # type: ignore[no-untyped-def]
        import torch

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = torch.nn.Linear(64, 64)

            def forward(self, x):  # type: ignore[no-untyped-def]
                h = torch.relu(self.fc(x))  # inside the forward
                return h * 2

        return Net()


def test_steps_record_the_callers_line_and_top_lines_name_it(tmp_path: Path) -> None:
    import torch

    from memwarden.analyze.timeline import summary
    from memwarden.record.live.recover import attribute_stream
    from memwarden.trace.steps import steps_of
    from memwarden.trace.stream import read_stream

    model = _UserModel.make()
    kept = []
    stream = tmp_path / "s.mwtrace"
    with memwarden.capture(stream_to=stream) as cap:
        for _ in range(4):
            kept.append(model(torch.randn(512, 64)))  # the caller keeps every output with its graph
        assert memwarden.flush()
        torn = stream.read_bytes()
    here = Path(__file__).read_text()
    call, inside = _line_of(here, "# the caller keeps every output"), _line_of(here, "# inside the forward")
    steps = steps_of(cap.trace)
    assert len(steps) == 4
    assert all(
        s.call_site is not None
        and s.call_site.endswith(f"test_lines.py:{call}:test_steps_record_the_callers_line_and_top_lines_name_it")
        for s in steps
    )
    top = summary(cap.trace).top_lines_at_peak
    assert top[0].line == call and Path(top[0].file).name == "test_lines.py"
    assert all(x.line != inside for x in top)  # the forward's own line is the caller's here
    # A stream cut before the stop (a killed process) keeps the call sites too.
    recovered = steps_of(attribute_stream(read_stream(torn)))
    assert [s.call_site for s in recovered] == [s.call_site for s in steps]


# Real-world cases (examples/realworld) whose finding named a line inside the model, the weights'
# line or the model's construction before steps recorded their callers: the planted line now comes
# first. Each marker is a piece of the planted line's text.
PLANTED_LINES = {
    "graph_outputs_list": ("graph-retention", "predictions.append(model(x)"),
    "graph_eval_losses_list": ("graph-retention", "losses.append(F.cross_entropy(model(x), y))"),
    "concat_manual_past": ("kv-concat-growth", "k = torch.cat([past[0], k], dim=2)"),
    "dequant_cast_every_forward": ("dequant-temporaries", "self.weight.to(x.dtype) * self.scale"),
    "reprefill_generate_one_token": ("kv-reprefill", "ids = model.generate(ids, attention_mask="),
    # The graphs are kept by the statement after the call, not by the call: the holder line (the
    # newest block the loop's own function made after the oldest kept step and still live at the
    # peak) comes first.
    "graph_total_loss": ("graph-retention", "total_loss += loss  # MISTAKE"),
    # Padding made outside torch: the line that built the padded ids (a step's input) comes first.
    "padding_tokenizer_list": ("alignment-padding", "ids = torch.tensor([r + [0] * (MAX_LENGTH - len(r))"),
    # Ids padded in numpy carry no allocation line (torch never allocated them): the line that
    # builds and feeds the padded batch, ``model(**collate(...))``, is the nearest the trace knows.
    "padding_max_length": ("alignment-padding", "logits = model(**collate(sentences(b))).logits"),
    # The cast after loading: ``from_pretrained(path, dtype=torch.float16)`` on this line is the fix.
    "load_from_pretrained_half": ("load-spike", "model = LlamaForCausalLM.from_pretrained(path).half()"),
    # The full state dict next to the built model: ``torch.load(path, mmap=True)`` on this line (and
    # a meta-device build on the line above, whose allocations the trace records inside ``build()``).
    "load_state_dict_copy": ("load-spike", "state_dict = torch.load(path)"),
    # The images at their full size: make_inputs is where they are resized to a lower max_pixels
    # (the media input's line comes before the call that fed it).
    "vision_multi_image": ("vision-token-dominance", "inputs = zoo.make_inputs(model, image_size=(1428, 728)"),
    "vision_qwen2vl_max_pixels": ("vision-token-dominance", "inputs = zoo.make_inputs(model, image_size=IMAGE_SIZE"),
    # The batch is made at each length in the helper module ``_tiny.prompt``, which makes whatever
    # size it is asked for: the loop's line that asks for the length and feeds the batch comes first.
    "frag_variable_length": ("fragmentation", "logits = model(prompt(n, batch=4, seed=i)).logits"),
    # Named first already before the line work of the scenario corpus, kept so every planted case is
    # covered: the dequantised weight saved for backward, the calls that feed the whole sequence
    # again without a cache, and the generate() that is not given the cache it should keep.
    "dequant_saved_for_backward": ("dequant-temporaries", "base = F.linear(x, self.weight.to(x.dtype) * self.scale"),
    "reprefill_greedy_positional": ("kv-reprefill", "logits = model(ids).logits  # MISTAKE"),
    "reprefill_use_cache_false": ("kv-reprefill", "out = model(input_ids=generated, attention_mask="),
    "reprefill_llava_chat_resend": ("kv-reprefill", "output = model.generate(**inputs, max_new_tokens=8"),
    # The patterns of issue 45: the statement that keeps the result (followed from the call through
    # the script's source), the reload that binds the new model over the old, the call that asks for
    # every position's logits, the call that passes num_beams.
    "retained_generate_hidden_states": ("retained-outputs", "results.append(out)"),
    "lib_nograd_llava_outputs": ("retained-outputs", "outputs.append(model(**inputs, output_hidden_states=True))"),
    "two_models_switch": ("two-models-alive", "self.model = tiny_llama(layers=4, hidden=hidden)"),
    "full_logits_scoring": ("full-logits", "logits = model(prompt(512, batch=4, seed=i)).logits"),
    "multiplier_num_beams": ("request-multiplier", "num_beams=8"),
}


def _realworld_accuracy():  # type: ignore[no-untyped-def]
    import importlib.util

    corpus = Path(__file__).resolve().parents[1] / "examples" / "realworld"
    spec = importlib.util.spec_from_file_location("realworld_accuracy_lines", corpus / "accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def pytest_generate_tests(metafunc) -> None:  # type: ignore[no-untyped-def]
    if "planted_case" in metafunc.fixturenames:
        metafunc.parametrize("planted_case", sorted(PLANTED_LINES))


def test_every_planted_realworld_case_has_its_planted_line() -> None:
    assert sorted(PLANTED_LINES) == sorted(c.name for c in _realworld_accuracy().cases() if c.expect)


def test_finding_names_the_planted_line_on_the_realworld_corpus(planted_case: str) -> None:
    accuracy = _realworld_accuracy()
    case = next(c for c in accuracy.cases() if c.name == planted_case)
    pattern, marker = PLANTED_LINES[planted_case]
    assert case.expect == pattern
    findings = [f for f in accuracy.diagnose_case(case) if f["pattern"] == pattern]
    assert findings, planted_case
    first = findings[0]["lines"][0]
    assert Path(first["file"]) == case.path
    assert first["line"] == _line_of(case.path.read_text(), marker), findings[0]["lines"]
