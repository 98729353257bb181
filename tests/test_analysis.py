"""One Analysis per trace: a report computes the summary, the free index and the allocator replay
once; every command talks about the same device; `report` and `diagnose --html` write one page;
steps reach the detectors as validated records."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import memwarden
import memwarden.analyze.patterns
from memwarden.analyze import timeline
from memwarden.analyze.analysis import Analysis
from memwarden.analyze.diagnose import diagnose
from memwarden.cli import main
from memwarden.models import zoo
from memwarden.plan import replay as plan_replay
from memwarden.trace.io import save
from memwarden.trace.model import Action, Trace, TraceBuilder

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def chat_trace() -> Trace:
    """Three turns of a tiny llava chat that resends the image: re-encodes and re-prefills."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model's ops cost less than a thread pool's hand-offs
    try:
        model = zoo.build_model("llava")
        inputs = zoo.make_inputs(model, prompt_tokens=32)
        with torch.no_grad(), memwarden.capture() as cap:
            for _ in range(3):
                model.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs("llava"))
    finally:
        torch.set_num_threads(threads)
    assert cap.trace is not None
    return cap.trace


@pytest.fixture(scope="module")
def chat_file(chat_trace: Trace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(chat_trace, tmp_path_factory.mktemp("analysis") / "chat.mwtrace")


def _count_calls(monkeypatch: pytest.MonkeyPatch, real: Callable[..., Any], counts: Counter[str]) -> None:
    """Wrap ``real`` with a counter wherever a memwarden module holds it (its own module and every
    ``from ... import`` of it), so no path that calls it goes uncounted. The real function runs."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        # replays of a part of the trace (the fragmentation rule's windows) are other computations
        whole = not args or not isinstance(args[0], Trace) or args[0].metadata
        counts[real.__name__ if whole else f"{real.__name__} of a window"] += 1
        return real(*args, **kwargs)

    held = [m for name, m in list(sys.modules.items()) if name.startswith("memwarden") and m is not None]
    patched = 0
    for module in held:
        for attr, value in list(vars(module).items()):
            if value is real:
                monkeypatch.setattr(module, attr, counted)
                patched += 1
    assert patched, f"{real.__name__} is held by no memwarden module"


def _import_everything_the_report_runs() -> None:
    """Import every detector and command module first, so their bindings get counted too."""
    for info in pkgutil.iter_modules(memwarden.analyze.patterns.__path__):
        importlib.import_module(f"memwarden.analyze.patterns.{info.name}")
    for name in ("memwarden.commands.report", "memwarden.commands.diagnose", "memwarden.report.full"):
        importlib.import_module(name)


@pytest.mark.parametrize("command", ["report", "diagnose"])
def test_a_report_computes_each_thing_once(
    command: str, chat_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _import_everything_the_report_runs()
    counts: Counter[str] = Counter()
    for real in (timeline.summary, timeline.free_index, plan_replay.replay):
        _count_calls(monkeypatch, real, counts)
    out = tmp_path / "page.html"
    argv = (
        ["report", str(chat_file), "-o", str(out)]
        if command == "report"
        else ["diagnose", str(chat_file), "--html", str(out)]
    )
    assert main(argv) == 0, capsys.readouterr().err
    page = out.read_text()
    assert "kv-reprefill" in page and "mw-heatmap" in page  # the detectors ran, and the heatmap was drawn
    windows = counts.pop("replay of a window", 0)
    assert counts == {"summary": 1, "free_index": 1, "replay": 1}
    assert windows <= 8  # fragmentation_steps' max_windows, replayed once per page


def test_report_and_diagnose_html_write_the_same_page(
    chat_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from_report, from_diagnose = tmp_path / "report.html", tmp_path / "diagnose.html"
    assert main(["report", str(chat_file), "-o", str(from_report)]) == 0
    assert main(["diagnose", str(chat_file), "--html", str(from_diagnose)]) == 0
    capsys.readouterr()

    def page(path: Path) -> str:  # a generated-at stamp, were there one, is the only thing allowed to differ
        return re.sub(r"generated at [^<]*", "", path.read_text())

    assert "Findings" in page(from_report)
    assert page(from_report) == page(from_diagnose)


def test_diagnose_and_the_report_take_a_trace_or_its_analysis(chat_trace: Trace, tmp_path: Path) -> None:
    """The public API wraps a Trace once; a caller holding the Analysis passes it instead."""
    analysis = Analysis(chat_trace)
    by_trace = [(f.pattern, f.saving_peak_bytes) for f in diagnose(chat_trace)]
    assert by_trace and [(f.pattern, f.saving_peak_bytes) for f in diagnose(analysis)] == by_trace
    memwarden.write_report(analysis, tmp_path / "page.html", heatmap=False)
    assert "kv-reprefill" in (tmp_path / "page.html").read_text()


def _two_device_trace() -> Trace:
    """cpu allocates first and little; cuda:0 allocates later and much more (the busiest device)."""
    b = TraceBuilder(devices=["cpu", "cuda:0"])
    b.event(1, Action.ALLOC, 0, 0x1000, 1 * MiB, device="cpu")
    for i in range(1, 4):
        b.event(10 * i, Action.ALLOC, i, 0x100000 * i, 64 * MiB, device="cuda:0")
    b.event(50, Action.FREE, 1, 0x100000, 64 * MiB, device="cuda:0")
    return b.build()


def test_every_command_talks_about_the_same_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _two_device_trace()
    assert Analysis(trace).device == 1
    path = save(trace, tmp_path / "two.mwtrace")
    assert main(["summary", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main(["replay", str(path), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert summary["device"] == "cuda:0"
    assert summary["peak_bytes"] == replayed["peak_allocated_bytes"] == 3 * 64 * MiB
    assert main(["replay", str(path), "--json", "--device", "cpu"]) == 0  # an explicit device still wins
    assert json.loads(capsys.readouterr().out)["peak_allocated_bytes"] == 1 * MiB


def test_replays_are_memoised_per_arguments(chat_trace: Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    counts: Counter[str] = Counter()
    _count_calls(monkeypatch, plan_replay.replay, counts)
    analysis = Analysis(chat_trace)
    plain = analysis.replay()
    assert analysis.replay() is plain and counts["replay"] == 1
    drawn = analysis.replay(history_columns=50)  # needs the layout history the first one lacks
    assert counts["replay"] == 2 and drawn.history is not None and plain.history is None
    assert drawn.to_json() == plain.to_json()  # recording history changes no number
    expandable = analysis.replay(allocator="pytorch-expandable")
    assert counts["replay"] == 3 and expandable.allocator == "pytorch-expandable"

    hinted = Analysis(chat_trace, replay_history_columns=50)
    first = hinted.replay()  # records the history a heatmap will ask for...
    assert hinted.replay(history_columns=50) is first and counts["replay"] == 4  # ...so this one is free


def test_cached_arrays_are_read_only(chat_trace: Trace) -> None:
    analysis = Analysis(chat_trace)
    for values in (analysis.signed_bytes, analysis.live_bytes, analysis.free_index):
        with pytest.raises(ValueError):
            values[0] = 0  # shared by every detector: one writer would corrupt all the others
    assert int(analysis.live_bytes.max()) == analysis.summary.peak_bytes


def test_malformed_steps_change_no_finding(chat_trace: Trace) -> None:
    """Steps reach detectors only through steps_of: entries that are not steps are skipped, not parsed."""
    clean = diagnose(chat_trace)
    assert "kv-reprefill" in {f.pattern for f in clean}  # the steps' input ids are what find the re-prefill
    junk: list[Any] = ["prefill", 7, None, {"phase": 3, "start_us": 0, "end_us": 1}, {"start_us": "x"}]
    metadata = dict(chat_trace.metadata, steps=junk + list(chat_trace.metadata["steps"]))
    hostile = Trace(
        events=chat_trace.events,
        spans=chat_trace.spans,
        strings=chat_trace.strings,
        shapes=chat_trace.shapes,
        devices=chat_trace.devices,
        metadata=metadata,
    )
    assert Analysis(hostile).steps == Analysis(chat_trace).steps
    assert [f.to_json() for f in diagnose(hostile)] == [f.to_json() for f in clean]
