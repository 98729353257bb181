"""The report's flame graph (issue 25): bytes at the peak from the user's line down to module and op,
drawn as an SVG in the page itself, whose widths add up to the peak."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

SCRIPT = """
import torch

model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))

def helper():
    return torch.zeros(4 << 20, dtype=torch.uint8)  # helper

kept = helper()
with torch.no_grad():
    out = model(torch.randn(512, 256))  # model call
held = torch.empty(32 << 20, dtype=torch.uint8)  # planted
"""

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


class _Boxes(HTMLParser):
    """The flame graph's boxes in document order: (depth, bytes, level), and its total."""

    def __init__(self) -> None:
        super().__init__()
        self.boxes: list[tuple[int, int, str]] = []
        self.labels: list[str] = []
        self.titles: list[str] = []
        self.total = -1
        self._in_label = self._in_title = False

    def handle_starttag(self, tag, attrs):
        d = dict(attrs)
        if tag == "svg" and "mw-flame" in (d.get("class") or ""):
            self.total = int(d["data-total-bytes"])
        elif tag == "g" and "mw-flame-box" in (d.get("class") or ""):
            self.boxes.append((int(d["data-depth"]), int(d["data-bytes"]), d["data-level"]))
            self.labels.append("")
            self.titles.append("")
        elif tag == "title" and self.boxes:
            self._in_title = True
        elif tag == "text" and "mw-flame-label" in (d.get("class") or ""):
            self._in_label = True

    def handle_endtag(self, tag):
        if tag == "text":
            self._in_label = False
        elif tag == "title":
            self._in_title = False

    def handle_data(self, data):
        if self._in_label:
            self.labels[-1] += data
        elif self._in_title:
            self.titles[-1] += data


def _report(tmp_path: Path) -> tuple[Path, int, str]:
    import memwarden
    from memwarden.analyze.analysis import Analysis
    from memwarden.report.full import write_report

    script = tmp_path / "planted_flame.py"
    script.write_text(SCRIPT)
    # traced in a fresh interpreter, as `memwarden trace` runs it: tensors other tests keep alive in
    # this process would be part of the peak
    out = tmp_path / "planted.mwtrace"
    proc = subprocess.run(
        [sys.executable, "-m", "memwarden", "trace", "-o", str(out), str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = memwarden.load(out)
    peak = Analysis(trace).summary.peak_bytes
    return write_report(trace, tmp_path / "report.html", heatmap=False), peak, SCRIPT


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if marker in text)


def _check(parser: _Boxes, peak: int) -> None:
    boxes = parser.boxes
    assert boxes, "no flame graph boxes"
    assert parser.total == peak
    assert sum(b for d, b, _ in boxes if d == 0) == peak  # the top row spans the whole peak
    # Every box's children (the boxes one level deeper that follow it, in document order) add up to it.
    for i, (depth, nbytes, _) in enumerate(boxes):
        if depth == 2:
            continue
        children, j = 0, i + 1
        while j < len(boxes) and boxes[j][0] > depth:
            children += boxes[j][1] if boxes[j][0] == depth + 1 else 0
            j += 1
        assert children == nbytes, (i, boxes[i], children)
    assert {level for _, _, level in boxes} == {"line", "module", "op"}


def test_flame_graph_widths_add_up_to_the_peak(tmp_path: Path) -> None:
    report, peak, _ = _report(tmp_path)
    page = report.read_text(encoding="utf-8")
    parser = _Boxes()
    parser.feed(page)
    _check(parser, peak)
    # the planted line is the widest user line; the model call's line sits above its modules' ops
    top = [(b, label) for (d, b, _), label in zip(parser.boxes, parser.labels, strict=True) if d == 0]
    assert top[0] == (32 << 20, f"planted_flame.py:{_line('# planted')}")
    call = f"planted_flame.py:{_line('# model call')} in <module>"
    i = next(k for k, title in enumerate(parser.titles) if call in title and parser.boxes[k][0] == 0)
    below = []
    for (d, _, _), title in zip(parser.boxes[i + 1 :], parser.titles[i + 1 :], strict=False):
        if d == 0:
            break
        below.append(title)
    assert any(t.startswith("aten::linear") for t in below), below  # the Linear layer's op, under the call
    assert "cdn" not in page.lower() and "<script src" not in page


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (scripts/install-chromium.sh)")
def test_browser_renders_the_flame_graph(tmp_path: Path) -> None:
    report, peak, _ = _report(tmp_path)
    profile = tempfile.mkdtemp(prefix="chrome-profile-", dir=tmp_path)
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        "--dump-dom",
        "--window-size=1400,1000",
        report.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parser = _Boxes()
    parser.feed(proc.stdout)  # the DOM Chromium built: the SVG is part of the rendered page
    _check(parser, peak)
    assert f"planted_flame.py:{_line('# planted')}" in parser.labels


def test_gathered_small_boxes_keep_the_levels_below() -> None:
    """Boxes under the share threshold become one "(n smaller)" box whose modules and ops are those
    of the boxes it gathered, so every level still adds up (a run with many small lines)."""
    from memwarden.report.flame import FlameNode, _gather_small

    root = FlameNode("all")
    for i, nbytes in enumerate([1000, 3, 4, 5]):
        line = root.children.setdefault(f"l{i}", FlameNode(f"l{i}"))
        module = line.children.setdefault("m", FlameNode("m"))
        module.children[f"op{i % 2}"] = FlameNode(f"op{i % 2}", nbytes)
        module.nbytes = line.nbytes = nbytes
        root.nbytes += nbytes
    _gather_small(root, 10)
    gathered = root.children["(3 smaller)"]
    assert gathered.nbytes == 12
    assert gathered.children["m"].nbytes == 12
    assert sum(v.nbytes for v in gathered.children["m"].children.values()) == 12  # op0 4 + op1 8
