"""The report as a person uses it, in a real headless Chromium: the answer first, findings linked
to their evidence on the timeline, markers with tooltips, the legend, zoom."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from memwarden.report.full import write_report
from test_report import CHROMIUM, _chromium, _data_block, _dom, vlm_trace

needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on PATH; `make browser` installs one where a package manager exists"
)

# Drives the page like a user, then leaves what it saw on <body data-*> for --dump-dom.
_PROBE = """<script>
(function () {
  var d = document.body.dataset, s = document.getElementById("mw-status");
  var c = document.getElementById("mw-timeline");
  function at(name) { return s.getAttribute(name); }
  d.first = [at("data-baseline"), at("data-series"), at("data-view"), at("data-markers")].join("|");
  // hover the first marker
  var r = c.getBoundingClientRect(), xy = at("data-marker-xy").split(",");
  c.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + Number(xy[0]), clientY: r.top + Number(xy[1]), bubbles: true}));
  d.markerTip = document.getElementById("mw-tooltip").textContent;
  c.dispatchEvent(new MouseEvent("click", {clientX: r.left + Number(xy[0]), clientY: r.top + Number(xy[1]), bubbles: true}));
  d.followed = at("data-followed") || "";
  // follow the finding's link to its evidence
  document.querySelector("a.mw-goto").click();
  d.afterLink = [at("data-focus"), at("data-view")].join("|");
  // zoom by dragging over the middle of the plot, then reset with a double-click
  function mouse(type, fx) {
    var ev = new MouseEvent(type, {clientX: r.left + r.width * fx, clientY: r.top + r.height / 2, bubbles: true});
    (type === "mouseup" ? window : c).dispatchEvent(ev);
  }
  c.dispatchEvent(new MouseEvent("dblclick", {bubbles: true}));
  mouse("mousedown", 0.4); mouse("mousemove", 0.6); mouse("mouseup", 0.6);
  d.afterZoom = at("data-view");
  c.dispatchEvent(new MouseEvent("dblclick", {bubbles: true}));
  // the legend: hide the weights, and the plot starts at zero
  Array.prototype.forEach.call(document.querySelectorAll(".mw-legend-item"), function (b) {
    if (b.textContent.indexOf("weight") === 0) b.click();
  });
  d.afterLegend = [at("data-baseline"), at("data-series")].join("|");
  document.getElementById("mw-baseline").click();
})();
</script></body>"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(vlm_trace(), tmp_path_factory.mktemp("browser") / "report.html")


def test_page_leads_with_the_answer_and_the_findings(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    answer = re.search(r'<p id="answer" class="mw-answer">(.*?)</p>', page)
    assert answer, "no answer sentence"
    text = answer.group(1)
    # the re-encodes cost work, not peak: named, never called the cause of the peak (issue 45)
    for part in (
        "Peak 187.1 MiB at",
        "in prefill",
        "weights are",
        "No finding lowers the peak by 1% or more; kv-reprefill",
        "Fix: ",
    ):
        assert part in text, part
    assert "Biggest cause" not in text
    order = [page.index(marker) for marker in ('id="answer"', 'id="findings"', 'id="timeline"', 'id="sites"')]
    assert order == sorted(order), "the answer, then findings, then the timeline, then the tables"
    assert "the fix saves 128.0 KiB at the peak and 84.0 MiB of allocation" in page
    sites = page.split('id="sites"')[1].split("</section>")[0]
    assert sites.index("Working memory") < sites.index("Weights and buffers")  # weights grouped apart


def test_evidence_markers_sit_where_the_repeats_happened(report: Path) -> None:
    data = _data_block(report.read_text(encoding="utf-8"))
    marks = [m for m in data["markers"] if m["finding"] == 1]
    assert marks and all(m["time_us"] != data["peak"]["time_us"] for m in marks)
    encodes = [p for p in data["lanes"]["phases"] if p["phase"] == "encode"]
    second = encodes[1]
    assert any(second["start"] <= m["time_us"] <= second["end"] for m in marks), (marks, encodes)
    phases = sorted(data["lanes"]["phases"], key=lambda p: p["start"])
    assert all(a["end"] <= b["start"] for a, b in zip(phases, phases[1:], strict=False))  # no overlaps


@pytest.mark.browser
@needs_browser
def test_a_user_can_follow_hover_zoom_and_toggle(tmp_path: Path, report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)  # let the probe run
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", _PROBE), encoding="utf-8")
    body = _dom(tmp_path, probe.as_uri()).body
    assert body.get("data-rendered") == "1" and "data-render-error" not in body, body
    data = _data_block(page)
    baseline, series, view, markers = body["data-first"].split("|")
    assert int(baseline) == data["baseline_bytes"] > 0  # opens above the constant weights
    assert int(markers) >= 1
    assert "kv-reprefill" in body["data-marker-tip"] and "encoded the same input again" in body["data-marker-tip"]
    assert body["data-followed"] == "finding-1"
    focus, link_view = body["data-after-link"].split("|")
    lo, hi = map(int, link_view.split(","))
    marks = [m["time_us"] for m in data["markers"] if m["finding"] == 1]
    assert focus == "1" and lo <= min(marks) and max(marks) <= hi and hi - lo < data["duration_us"]
    z0, z1 = map(int, body["data-after-zoom"].split(","))
    assert 0 < z0 < z1 < data["duration_us"]
    base_after, series_after = body["data-after-legend"].split("|")
    assert base_after == "0" and int(series_after) == int(series) - 1


@pytest.mark.browser
@needs_browser
def test_screenshot_has_the_answer_and_the_plot_on_the_first_screen(tmp_path: Path, report: Path) -> None:
    facts = _dom(tmp_path, report.as_uri())
    assert facts.body.get("data-rendered") == "1"
    y, h = int(facts.status["data-plot-y"]), int(facts.status["data-plot-h"])
    assert y + h <= 1200, "answer, findings and the whole timeline fit a 1400x1200 window"
    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1200", report.as_uri())
    keep = os.environ.get("MEMWARDEN_SHOTS")
    if keep:
        shutil.copy(shot, Path(keep) / "test_browser_report.png")
