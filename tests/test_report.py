"""The HTML report: self-contained, escaped, and really drawn in a headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from memwarden.report.html import Section, render_html, write_html
from memwarden.trace.io import save
from memwarden.trace.model import (
    EVENT_COLUMNS,
    SPAN_COLUMNS,
    Action,
    Category,
    Modality,
    Phase,
    SpanKind,
    Trace,
    TraceBuilder,
)

MiB = 1024 * 1024
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (scripts/install-chromium.sh)")
XSS = "</script><script>document.body.dataset.pwned='1'</script>"
XSS_IMG = "<img src=x onerror=\"document.body.dataset.pwned='1'\">"


# -- a realistic VLM run, built by hand ------------------------------------------------------


class _Run:
    """Allocates and frees like a small VLM would: load, encode, project, prefill, decode."""

    def __init__(self, metadata: dict[str, object]):
        self.b = TraceBuilder(metadata=metadata)
        self.spans: list[dict] = []  # emitted in this order, so a list index is the span's row
        self.now_us = 0
        self.next_id = 0
        self.next_addr = 0x10000
        self.live: dict[int, dict[str, object]] = {}

    def tick(self, us: int) -> int:
        self.now_us += us
        return self.now_us

    def alloc(self, nbytes: int, category: Category, modality: Modality, phase: Phase, module: str, op: str) -> int:
        tid = self.next_id
        self.next_id += 1
        attrs = dict(category=category, modality=modality, phase=phase, module=module, op=op, dtype="float16")
        self.live[tid] = dict(attrs, address=self.next_addr, nbytes=nbytes)
        self.b.event(self.tick(3), Action.ALLOC, tid, self.next_addr, nbytes, **attrs)
        self.next_addr += nbytes
        return tid

    def free(self, tid: int) -> None:
        a = self.live.pop(tid)
        address, nbytes = a.pop("address"), a.pop("nbytes")
        self.b.event(self.tick(2), Action.FREE, tid, address, nbytes, **a)

    def span(self, start_us: int, end_us: int, kind: SpanKind, name: str, **kw) -> int:
        self.spans.append(dict(start_us=start_us, end_us=end_us, kind=kind, name=name, **kw))
        return len(self.spans) - 1

    def module(self, name: str, modality: Modality, phase: Phase, fp: str | None, parent: int, depth: int, body):
        start = self.tick(5)
        row = self.span(
            start,
            start,
            SpanKind.MODULE,
            name,
            phase=phase,
            modality=modality,
            fingerprint=fp,
            parent=parent,
            depth=depth,
        )
        body(row)  # children get rows after this one
        self.spans[row]["end_us"] = self.tick(5)
        return row

    def build(self) -> Trace:
        for s in self.spans:
            self.b.span(s.pop("start_us"), s.pop("end_us"), s.pop("kind"), s.pop("name"), **s)
        return self.b.build()


def vlm_trace(
    module_prefix: str = "", model: str = "tiny-llava-test", layers: int = 4, decode_steps: int = 12
) -> Trace:
    run = _Run(
        {
            "model": model,
            "device": "cpu",
            "capture_method": "live",
            "torch_version": "2.5.1+cpu",
            "created_at": "2026-12-02T17:00:00Z",
        }
    )
    p = module_prefix
    W, V, T, F = Category.WEIGHT, Modality.VISION, Modality.TEXT, Modality.FUSION
    A, K, TMP = Category.ACTIVATION, Category.KV_CACHE, Category.TEMPORARY

    # load: weights, with an fp32 copy freed after the cast (what load-spike looks for)
    t = run.tick(10)
    for i in range(layers):
        for part, mb in (("self_attn", 3), ("mlp", 5)):
            tmp = run.alloc(mb * 2 * MiB, TMP, V, Phase.LOAD, f"{p}vision_tower.encoder.layers.{i}.{part}", "aten::to")
            run.alloc(mb * MiB, W, V, Phase.LOAD, f"{p}vision_tower.encoder.layers.{i}.{part}", "aten::empty")
            run.tick(250)
            run.free(tmp)
    run.alloc(6 * MiB, W, F, Phase.LOAD, f"{p}multi_modal_projector.linear_1", "aten::empty")
    for i in range(layers):
        for part, mb in (("self_attn", 8), ("mlp", 14)):
            run.alloc(mb * MiB, W, T, Phase.LOAD, f"{p}language_model.model.layers.{i}.{part}", "aten::empty")
            run.tick(300)
    run.alloc(20 * MiB, W, T, Phase.LOAD, f"{p}lm_head", "aten::empty")
    run.span(t, run.tick(10), SpanKind.PHASE, "load", phase=Phase.LOAD)

    kv: dict[int, int] = {}

    def encode(fp: str) -> list[int]:
        t0 = run.tick(10)
        kept: list[int] = []

        def tower(row: int) -> None:
            x = run.alloc(4 * MiB, A, V, Phase.ENCODE, f"{p}vision_tower.embeddings", "aten::conv2d")
            for i in range(layers):

                def layer(r: int, i: int = i) -> None:
                    nonlocal x
                    name = f"{p}vision_tower.encoder.layers.{i}"

                    def attn(_: int) -> None:
                        scores = run.alloc(12 * MiB, TMP, V, Phase.ENCODE, f"{name}.self_attn", "aten::matmul")
                        run.tick(400)
                        run.free(scores)

                    run.module(f"{name}.self_attn", V, Phase.ENCODE, fp, r, 2, attn)
                    run.module(f"{name}.mlp", V, Phase.ENCODE, fp, r, 2, lambda _: run.tick(600))
                    y = run.alloc(4 * MiB, A, V, Phase.ENCODE, f"{name}.mlp", "aten::gelu")
                    run.free(x)
                    x = y

                run.module(f"{p}vision_tower.encoder.layers.{i}", V, Phase.ENCODE, fp, row, 1, layer)
            kept.append(x)

        run.module(f"{p}vision_tower", V, Phase.ENCODE, fp, -1, 0, tower)

        def proj(_: int) -> None:
            padded = run.alloc(16 * MiB, A, F, Phase.ENCODE, f"{p}multi_modal_projector", "aten::constant_pad_nd")
            run.tick(300)
            kept.append(padded)

        run.module(f"{p}multi_modal_projector", F, Phase.ENCODE, fp, -1, 0, proj)
        run.span(t0, run.tick(5), SpanKind.PHASE, "encode", phase=Phase.ENCODE)
        return kept

    def lm(phase: Phase, tokens: int, fp: str) -> None:
        def body(row: int) -> None:
            for i in range(layers):

                def layer(r: int, i: int = i) -> None:
                    name = f"{p}language_model.model.layers.{i}"
                    h = run.alloc(tokens * 64 * 1024, A, T, phase, f"{name}.mlp", "aten::linear")
                    grown = run.alloc(
                        (tokens + (kv.get(i) is not None)) * 32 * 1024, K, T, phase, f"{name}.self_attn", "aten::cat"
                    )
                    if i in kv:
                        run.free(kv[i])  # concat growth: old K/V freed after the new one exists
                    kv[i] = grown
                    run.module(
                        f"{name}.self_attn",
                        T,
                        phase,
                        fp,
                        r,
                        2,
                        lambda _: run.tick(200 if phase == Phase.DECODE else 900),
                    )
                    run.module(
                        f"{name}.mlp", T, phase, fp, r, 2, lambda _: run.tick(150 if phase == Phase.DECODE else 700)
                    )
                    run.free(h)

                run.module(f"{name_root}.layers.{i}", T, phase, fp, row, 1, layer)
            logits = run.alloc(tokens * 96 * 1024, TMP, T, phase, f"{p}lm_head", "aten::linear")
            run.free(logits)

        name_root = f"{p}language_model.model"
        run.module(f"{p}language_model", T, phase, fp, -1, 0, body)

    for turn, image in enumerate(("sha1:9f2c4e1a", "sha1:9f2c4e1a")):  # same image twice: re-encoded
        kept = encode(image)
        t0 = run.tick(10)
        lm(Phase.PREFILL, 96, f"tok:{turn}a3b")
        run.span(t0, run.tick(5), SpanKind.PHASE, f"prefill {turn}", phase=Phase.PREFILL)
        for tid in kept:
            run.free(tid)
        t0 = run.tick(10)
        for step in range(decode_steps):
            lm(Phase.DECODE, 1, f"tok:{turn}-{step}")
        run.span(t0, run.tick(5), SpanKind.PHASE, f"decode {turn}", phase=Phase.DECODE)
    return run.build()


@pytest.fixture(scope="module")
def trace() -> Trace:
    return vlm_trace()


@pytest.fixture(scope="module")
def page(trace: Trace) -> str:
    return render_html(trace)


def _data_block(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="mw-data">(.*?)</script>', page, re.S)
    assert m, "data block missing"
    return json.loads(m.group(1))


# -- pure rendering ---------------------------------------------------------------------------


def test_page_is_self_contained(page: str):
    assert "http://" not in page and "https://" not in page
    for attr in re.findall(r'\b(?:src|href)\s*=\s*["\']?([^"\'\s>]*)', page):
        assert attr.startswith(("#", "data:")), attr
    assert "<link" not in page
    assert re.search(r"<script[^>]*\bsrc=", page) is None
    assert "default-src 'none'" in page  # CSP: a browser would refuse any fetch
    assert "@import" not in page and "url(" not in page


def test_page_contents(trace: Trace, page: str):
    for text in ("tiny-llava-test", "2.5.1+cpu", "live", "2026-12-02T17:00:00Z"):
        assert text in page
    for section in ('id="timeline"', 'id="breakdown"', 'id="sites"', 'id="modules"', 'id="mw-status"'):
        assert section in page
    assert "language_model.model.layers.0.mlp" in page  # a top site's module path
    assert "sha1:9f2c4e1a" in page  # fingerprint in the heaviest-modules table
    data = _data_block(page)
    assert set(data["timelines"]) == {"category", "modality", "phase"}
    cat = data["timelines"]["category"]
    names = {s["name"] for s in cat["series"]}
    assert {"weight", "activation", "kv_cache", "temporary"} <= names
    # the stacked series add up to the total at every point, and the peak is kept
    stacked = np.sum([s["values"] for s in cat["series"]], axis=0)
    assert np.array_equal(stacked, cat["total"])
    assert max(cat["total"]) == data["peak"]["bytes"] > 0
    lanes = data["lanes"]
    assert lanes["shown"] == lanes["total"] > 0 and max(lanes["modules"]["depth"]) == 2
    assert len(lanes["phases"]) == 7


def test_script_block_cannot_be_escaped():
    evil = vlm_trace(module_prefix=XSS, model=XSS_IMG, layers=2, decode_steps=2)
    page = render_html(evil, title=XSS)
    assert XSS not in page and XSS_IMG not in page
    assert page.count("<script") == 2 and page.count("</script") == 2
    data = _data_block(page)  # the escaped JSON still carries the exact names
    assert any(XSS in s for s in data["lanes"]["strings"])
    assert "&lt;/script&gt;" in page  # HTML-escaped in the tables


def test_sections_and_heatmap(trace: Trace):
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    page = render_html(
        trace, title="T", extra_sections=[Section("Findings", "<p class='f'>2 findings</p>")], heatmap_png=png
    )
    assert "<p class='f'>2 findings</p>" in page
    assert 'href="#findings"' in page and 'id="findings"' in page
    assert 'src="data:image/png;base64,iVBORw0KGgo' in page
    with pytest.raises(ValueError):
        render_html(trace, heatmap_png=b"GIF89a")


def test_empty_trace_renders():
    page = render_html(TraceBuilder().build())
    assert _data_block(page)["timelines"]["category"]["time_us"] == []


def test_write_html_is_atomic(tmp_path: Path, trace: Trace):
    out = write_html(trace, tmp_path / "r.html", title="x")
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]
    assert out.stat().st_mode & 0o644 == 0o644  # readable like any new file, not mkstemp's 0600


def test_large_trace_stays_small():
    """1M events and 20k module calls: timeline downsampled, lanes capped, file well under 2 MB."""
    rng = np.random.default_rng(0)
    n_blocks, window = 500_000, 1000
    j = np.arange(n_blocks)
    nbytes = rng.integers(1024, MiB, n_blocks)
    time_us = np.concatenate([2 * j, 2 * (j + window) + 1])
    order = np.argsort(time_us, kind="stable")
    cols = {
        "time_us": time_us,
        "action": np.concatenate([np.full(n_blocks, Action.ALLOC), np.full(n_blocks, Action.FREE)]),
        "tensor": np.concatenate([j, j]),
        "address": np.concatenate([j, j]) * 4096,
        "nbytes": np.concatenate([nbytes, nbytes]),
        "device": np.zeros(2 * n_blocks),
        "category": np.tile(rng.integers(0, len(Category), n_blocks), 2),
        "modality": np.tile(rng.integers(0, len(Modality), n_blocks), 2),
        "phase": np.tile(rng.integers(0, len(Phase), n_blocks), 2),
        "module": np.tile(rng.integers(0, 50, n_blocks), 2),
        "op": np.full(2 * n_blocks, -1),
        "dtype": np.full(2 * n_blocks, -1),
        "shape": np.full(2 * n_blocks, -1),
    }
    events = {k: np.asarray(v)[order].astype(EVENT_COLUMNS[k]) for k, v in cols.items()}
    n_spans = 20_000
    start = np.sort(rng.integers(0, 2 * n_blocks, n_spans))
    spans = {
        "start_us": start,
        "end_us": start + rng.integers(1, 500, n_spans),
        "kind": np.full(n_spans, SpanKind.MODULE),
        "name": rng.integers(0, 50, n_spans),
        "phase": np.zeros(n_spans),
        "modality": np.zeros(n_spans),
        "fingerprint": rng.integers(50, 60, n_spans),
        "parent": np.full(n_spans, -1),
        "depth": rng.integers(0, 4, n_spans),
    }
    spans = {k: np.asarray(v).astype(SPAN_COLUMNS[k]) for k, v in spans.items()}
    strings = [f"model.layers.{i}.mlp" for i in range(50)] + [f"fp{i:08x}" for i in range(10)]
    big = Trace(events=events, spans=spans, strings=strings, metadata={"model": "big"})
    page = render_html(big)
    assert len(page.encode()) < 2 * MiB
    data = _data_block(page)
    assert len(data["timelines"]["category"]["time_us"]) <= 2000
    assert data["lanes"]["shown"] == 4000 and data["lanes"]["total"] == n_spans


# -- in a real browser ------------------------------------------------------------------------


class _DomFacts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.body: dict[str, str | None] = {}
        self.status: dict[str, str | None] = {}
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        d = dict(attrs)
        if tag == "body":
            self.body = d
        elif tag == "script":
            self.scripts += 1
        elif d.get("id") == "mw-status":
            self.status = d


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp(prefix="chrome-profile-", dir=tmp_path)
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _dom(tmp_path: Path, url: str) -> _DomFacts:
    facts = _DomFacts()
    facts.feed(_chromium(tmp_path, "--dump-dom", "--window-size=1400,1000", url).stdout)
    return facts


@pytest.fixture(scope="module")
def report_file(tmp_path_factory, trace: Trace) -> Path:
    return write_html(trace, tmp_path_factory.mktemp("report") / "report.html")


@pytest.mark.browser
@needs_browser
def test_browser_draws_timeline_and_lanes(tmp_path: Path, report_file: Path):
    facts = _dom(tmp_path, report_file.as_uri())
    assert facts.body.get("data-rendered") == "1", facts.body
    assert "data-render-error" not in facts.body
    assert int(facts.status["data-series"]) >= 4
    assert int(facts.status["data-points"]) > 100
    assert int(facts.status["data-spans"]) > 50
    assert facts.status["data-by"] == "category"
    # the stacking control: a link can open the page stacked by phase
    facts = _dom(tmp_path, report_file.as_uri() + "#by=phase")
    assert facts.body.get("data-rendered") == "1" and facts.status["data-by"] == "phase"
    assert int(facts.status["data-series"]) >= 4


@pytest.mark.browser
@needs_browser
def test_browser_screenshot_shows_a_plot(tmp_path: Path, report_file: Path):
    from matplotlib.image import imread

    facts = _dom(tmp_path, report_file.as_uri())
    x, y, w, h = (int(facts.status[f"data-plot-{k}"]) for k in "xywh")
    assert y + h <= 1000, "the plot must be on the first screen"
    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1000", report_file.as_uri())
    pixels = imread(shot)[y : y + h, x : x + w, :3]  # (h, w, rgb) floats in [0, 1]
    ink = np.abs(pixels - 1.0).max(axis=2) > 0.15  # neither the white background nor the light grid
    assert ink.mean() > 0.25, f"only {ink.mean():.1%} of the plot area is drawn"
    colours, counts = np.unique((pixels[ink] * 15).round().astype(int), axis=0, return_counts=True)
    big = counts > 0.002 * ink.size  # each a visible patch, not anti-aliasing
    assert int(big.sum()) >= 3, f"the stacked areas should show several colours, got {colours[big].tolist()}"
    keep = os.environ.get("MEMWARDEN_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


_PROBE = """<script>
(function () {
  var d = document.body.dataset;
  function move(id, fx, y) {
    var c = document.getElementById(id), r = c.getBoundingClientRect();
    c.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + r.width * fx, clientY: r.top + y, bubbles: true}));
    return document.getElementById("mw-tooltip").textContent;
  }
  d.tipTimeline = move("mw-timeline", 0.5, 200);
  d.tipLanes = "";
  for (var fx = 0; fx < 1 && d.tipLanes.indexOf("fingerprint") < 0; fx += 0.004) {
    d.tipLanes = move("mw-lanes", fx, 8 + 17 * 1.5);  // along the depth-0 row until a call is hit
  }
  document.querySelector('.mw-stack button[data-by="modality"]').click();
  var s = document.getElementById("mw-status");
  d.afterClick = s.getAttribute("data-by") + ":" + s.getAttribute("data-series");
})();
</script></body>"""


@pytest.mark.browser
@needs_browser
def test_browser_hover_and_stack_switch(tmp_path: Path, report_file: Path):
    """Drive the page like a user: hover the timeline and a lane, then switch the stacking."""
    page = report_file.read_text(encoding="utf-8")
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)  # let the probe run
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", _PROBE), encoding="utf-8")
    body = _dom(tmp_path, probe.as_uri()).body
    assert body.get("data-rendered") == "1"
    tip = body["data-tip-timeline"]
    assert " ms" in tip and "total" in tip and "MiB" in tip
    assert all(name in tip for name in ("weight", "activation", "kv_cache"))
    assert "vision_tower" in body["data-tip-lanes"] and "sha1:9f2c4e1a" in body["data-tip-lanes"]
    assert body["data-after-click"] == "modality:3"


@pytest.mark.browser
@needs_browser
def test_browser_ignores_markup_in_trace_strings(tmp_path: Path):
    evil = vlm_trace(module_prefix=XSS, model=XSS_IMG, layers=2, decode_steps=2)
    path = write_html(evil, tmp_path / "evil.html", title=XSS)
    facts = _dom(tmp_path, path.as_uri())
    assert facts.body.get("data-rendered") == "1"
    assert "data-pwned" not in facts.body
    assert facts.scripts == 2  # nothing broke out of the JSON block


# -- the command line ------------------------------------------------------------------------


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    return subprocess.run(
        [sys.executable, "-m", "memwarden.cli", "report", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli_writes_report(tmp_path: Path, trace: Trace):
    save(trace, tmp_path / "trace.mwtrace")
    proc = _cli(tmp_path, "trace.mwtrace", "-o", "out.html", "--title", "My run")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out.html"
    assert out.exists() and "<title>My run</title>" in out.read_text(encoding="utf-8")
    assert "out.html" in proc.stdout


@pytest.mark.parametrize("what", ["missing", "not-a-trace", "bad-output-dir"])
def test_cli_errors_are_one_line(tmp_path: Path, trace: Trace, what: str):
    out = "out.html"
    if what == "missing":
        name = "nope.mwtrace"
    elif what == "not-a-trace":
        name = "notes.txt"
        (tmp_path / name).write_text("hello, not a trace\n")
    else:
        name = "trace.mwtrace"
        save(trace, tmp_path / name)
        out = "no/such/dir/out.html"
    proc = _cli(tmp_path, name, "-o", out)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (name if what != "bad-output-dir" else "out.html") in lines[0]
    assert not (tmp_path / "out.html").exists()
    assert not list(tmp_path.rglob("*.partial"))


# -- the stress page --------------------------------------------------------------------------


def _side(name: str, ok: int, requests: int) -> dict:
    return {
        "name": name,
        "mode": "plain",
        "requests": requests,
        "ok": ok,
        "oom": requests - ok,
        "crash": 0,
        "lost": 0,
        "failure_rate": 1 - ok / requests,
        "p50_latency_s": 1.0,
        "p95_latency_s": 1.0,
        "p50_latency_ci_s": None,
        "recovery_p50_s": None,
        "recoveries": 0,
        "peak_rss_p50_bytes": MiB,
        "peak_rss_max_bytes": MiB,
        "worker_restarts": 0,
    }


def test_stress_latency_chart_draws_one_answer_and_has_real_axes():
    from memwarden.resilience.report import render_stress_html

    def rec(i: int, status: str, latency: float | None) -> dict:
        return {
            "index": i,
            "status": status,
            "latency_s": latency,
            "recovery_s": None,
            "peak_rss_bytes": MiB,
            "output_sha": None,
            "error": None if status == "ok" else "out of memory",
        }

    result = {
        "a": _side("plain", 1, 3),
        "b": _side("governed", 3, 3),
        "failure_rate_p_value": 0.4,
        "p50_latency_diff_ci_s": None,
        "outputs_compared": 1,
        "outputs_equal": 1,
        "runs": 3,
        "seed": 0,
        "inject": [],
        "executor": "local",
        "records": {
            "a": [rec(0, "ok", 2.0), rec(1, "oom", None), rec(2, "oom", None)],
            "b": [rec(0, "ok", 1.0), rec(1, "ok", 3.0), rec(2, "ok", 8.3)],
        },
    }
    page = render_stress_html(result)
    svg = page.split('aria-label="latency CDF">')[1].split("</svg>")[0]
    a_path = re.search(r'<path d="([^"]+)" fill="none" stroke="#4e79a7"', svg)
    assert a_path and a_path.group(1).count("L") >= 3, "one answered request is one visible step"
    assert "answered in 2.00 s" in svg  # a dot with its own tooltip
    for label in ("0%", "50%", "100%", "latency of answered requests", "share answered within"):
        assert label in svg, label
    assert len(re.findall(r">\d+(?:\.\d+)? (?:s|ms)</text>", svg)) >= 4  # ticks along the time axis


def test_heatmap_shares_the_timeline_time_axis(trace: Trace):
    from memwarden.analyze.analysis import Analysis
    from memwarden.report.heatmap import _figure

    result = Analysis(trace).replay(history_columns=50)
    times_s = (trace.events["time_us"] - trace.events["time_us"][0]) / 1e6
    ax = _figure(result, None, 100, times_s).axes[0]
    assert ax.get_xlabel().startswith("time (s")
    assert ax.get_xlim() == pytest.approx((0.0, float(times_s[-1])))


# -- the source view (issue 25) ----------------------------------------------------------------

SOURCE_SCRIPT = """
import torch

def helper():
    return torch.zeros(4 << 20, dtype=torch.uint8)  # helper <b>&amp;</b>

kept = helper()
held = torch.empty(12 << 20, dtype=torch.uint8)  # planted </td><script>x()</script>
"""


class _SourceRows(HTMLParser):
    """The source view's table as text: one list of cell texts per body row."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.tags: list[str] = []
        self._in_table = self._in_cell = False

    def handle_starttag(self, tag, attrs):
        if tag == "table" and "mw-source" in (dict(attrs).get("class") or ""):
            self._in_table = True
        elif self._in_table:
            self.tags.append(tag)
            if tag == "tr":
                self.rows.append([])
            elif tag == "td":
                self._in_cell = True
                self.rows[-1].append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_table = False
        elif tag == "td":
            self._in_cell = False

    def handle_data(self, data):
        if self._in_table and self._in_cell:
            self.rows[-1][-1] += data


def _source_report(tmp_path: Path) -> Path:
    """The script traced and reported as a user does it, in its own process: a capture in the test
    process also records what other threads allocate meanwhile, and a thread an earlier test left
    running (the full suite) can set the peak before the planted line runs, leaving no user line
    at the peak and so no source view (the browser test's old order-dependent failure)."""
    script = tmp_path / "planted_src.py"
    script.write_text(SOURCE_SCRIPT)
    trace, report = tmp_path / "run.mwtrace", tmp_path / "report.html"
    for args in (["trace", "-o", str(trace), str(script)], ["report", "--no-heatmap", "-o", str(report), str(trace)]):
        proc = subprocess.run(
            [sys.executable, "-m", "memwarden.cli", *args],
            capture_output=True,
            text=True,
            cwd=str(tmp_path),
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    return report


def test_report_source_view_names_lines_with_their_source(tmp_path: Path):
    page = _source_report(tmp_path).read_text(encoding="utf-8")
    parser = _SourceRows()
    parser.feed(page)
    rows = [r for r in parser.rows if r]
    assert rows, "no source view table"
    lines = SOURCE_SCRIPT.splitlines()
    planted = next(i for i, text in enumerate(lines, 1) if "# planted" in text)
    helper = next(i for i, text in enumerate(lines, 1) if "# helper" in text)
    location, function, at_peak, allocated, source = rows[0]
    assert location == f"planted_src.py:{planted}" and function == "<module>"
    assert at_peak == allocated == "12.0 MiB"
    assert source == lines[planted - 1].strip()  # the line's text, markup shown as text
    assert [f"planted_src.py:{helper}", "helper"] == rows[1][:2] and rows[1][4] == lines[helper - 1].strip()
    assert "script" not in parser.tags  # the line's "<script>" stayed text: escaped
    assert "<b>&amp;</b>" not in page and "&lt;b&gt;&amp;amp;&lt;/b&gt;" in page


def test_source_lines_read_only_from_regular_python_files(tmp_path: Path):
    from memwarden.report.source_view import read_source_lines

    good = tmp_path / "ok.py"
    good.write_text("a = 1\nb = 2\n")
    fifo = tmp_path / "fifo.py"  # opening a FIFO for reading would block forever
    os.mkfifo(fifo)
    (tmp_path / "dir.py").mkdir()
    text = tmp_path / "notes.txt"
    text.write_text("secret\n")
    wanted = [
        (str(good), 2),
        (str(good), 9),
        (str(fifo), 1),
        (str(tmp_path / "dir.py"), 1),
        (str(text), 1),
        (str(tmp_path / "gone.py"), 1),
        ("/dev/zero", 1),
    ]
    assert read_source_lines(wanted) == {(str(good), 2): "b = 2"}


@pytest.mark.browser
@needs_browser
def test_browser_shows_the_source_view(tmp_path: Path):
    report = _source_report(tmp_path)
    dom = _chromium(tmp_path, "--dump-dom", "--window-size=1400,1000", report.as_uri()).stdout
    parser = _SourceRows()
    parser.feed(dom)
    rows = [r for r in parser.rows if r]
    planted = next(i for i, text in enumerate(SOURCE_SCRIPT.splitlines(), 1) if "# planted" in text)
    assert rows and rows[0][0] == f"planted_src.py:{planted}" and "</td><script>x()</script>" in rows[0][4]
