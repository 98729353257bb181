#!/usr/bin/env bash
# The prepared GPU check (issue 20): every `cuda`-marked test, and a live CUDA capture of two zoo
# models compared with PyTorch's own counters and with memwarden's allocator model. Prints one
# table; writes it, the log and a small recorded memory-history fixture under $OUT.
#
#   OUT=/tmp/gpu-check bash scripts/gpu-check.sh
#
# Needs python3 with torch (CUDA), transformers, numpy, pytest; no network, no pip install.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/memwarden-gpu-check}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
LOG="$OUT/gpu-check.log"
RESULTS="$OUT/results.jsonl"
: >"$LOG"
: >"$RESULTS"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
say() { echo "[$(($(date +%s) - start))s] $*" | tee -a "$LOG"; }

say "build the native CPU recorder"
timeout 240 python3 -m memwarden.record.native --build >>"$LOG" 2>&1 || say "native build FAILED"

cat >"$WORK/check.py" <<'PY'
"""One model, one fresh process: capture on CUDA, compare with torch's counters and the model."""
import json, pickle, sys, time
import torch
from memwarden.analyze.timeline import summary
from memwarden.record.cuda.capture import MARKER_END_BYTES, MARKER_START_BYTES, capture_cuda
from memwarden.record.cuda.merge import peak_reserved_bytes
from memwarden.models import zoo
from memwarden.plan.replay import replay
from memwarden.trace.io import save

name, size, mode, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
model = zoo.build_model(name, size)
inputs = zoo.make_inputs(model, size=size)
torch.cuda.init()
torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
with capture_cuda() as cap:
    model.to("cuda")
    cuda_inputs = {k: v.to("cuda") for k, v in inputs.items()}
    with torch.no_grad():
        if mode == "forward":
            model(**cuda_inputs)
        else:
            model.generate(**cuda_inputs, max_new_tokens=4, **zoo.generate_kwargs(name))
torch.cuda.synchronize()
seconds = time.perf_counter() - t0
real_alloc, real_res = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
trace = cap.trace
gpu = trace.device_index("cuda:0")
s = summary(trace, device=gpu)
res = dict(model=f"{name}/{size}/{mode}", seconds=round(seconds, 2), events=trace.num_events,
           capture_peak=s.peak_bytes, max_memory_allocated=real_alloc,
           trace_reserved=peak_reserved_bytes(trace, gpu), max_memory_reserved=real_res,
           model_reserved=(model_replay := replay(trace, device=gpu)).peak_reserved_bytes,
           model_allocated=model_replay.peak_allocated_bytes,
           by_phase=s.by_phase_peak, by_modality=s.by_modality_at_peak, by_category=s.by_category_at_peak,
           cpu_peak=summary(trace, device=trace.device_index("cpu")).peak_bytes)
if out != "-":  # the fixture: history, the CPU trace of the same run, and what was measured
    with open(f"{out}/cuda_history.pickle", "wb") as fh:
        pickle.dump(cap.snapshot, fh)
    save(cap.cpu_trace, f"{out}/cuda_cpu.mwtrace")
    storages = {}
    for t in list(model.parameters()) + list(model.buffers()):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    facts = dict(model=res["model"], torch_version=torch.__version__, device_name=torch.cuda.get_device_name(),
                 anchors=[a.to_json() for a in cap.anchors], tags=[t.to_json() for t in cap.tags],
                 marker_bytes=[MARKER_START_BYTES, MARKER_END_BYTES], max_memory_allocated=real_alloc,
                 max_memory_reserved=real_res, parameter_bytes=sum(storages.values()))
    with open(f"{out}/cuda_run.json", "w") as fh:
        json.dump(facts, fh, indent=1)
print("RESULT " + json.dumps(res))
PY

cat >"$WORK/probe.py" <<'PY'
"""CUDA runtime memory outside tensors: the context (driver-side, as nvidia-smi counts it) and the
cuBLAS/cuBLASLt workspaces PyTorch allocates through its caching allocator on the first matmul."""
import json, subprocess, sys
def used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.strip() else None
before = used_mib()
import torch
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
after_init = used_mib()
res = dict(torch=torch.__version__, cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(),
           capability=list(torch.cuda.get_device_capability()), nvidia_smi_before_mib=before,
           nvidia_smi_after_init_mib=after_init, reserved_after_init=torch.cuda.memory_reserved())
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(64, 256, device="cuda", dtype=dtype); w = torch.randn(512, 256, device="cuda", dtype=dtype)
    b = torch.randn(512, device="cuda", dtype=dtype)
    torch.cuda.synchronize(); a0 = torch.cuda.memory_allocated()
    y = torch.nn.functional.linear(x, w); torch.cuda.synchronize(); a1 = torch.cuda.memory_allocated()
    z = torch.nn.functional.linear(x, w, b); torch.cuda.synchronize(); a2 = torch.cuda.memory_allocated()
    q = torch.bmm(x[None], w.t()[None]); torch.cuda.synchronize(); a3 = torch.cuda.memory_allocated()
    res[f"workspace_{str(dtype)[6:]}"] = dict(linear=a1 - a0 - y.nbytes, addmm=a2 - a1 - z.nbytes, bmm=a3 - a2 - q.nbytes)
torch.cuda.synchronize()
res["nvidia_smi_after_matmul_mib"] = used_mib()
res["allocated_after"] = torch.cuda.memory_allocated(); res["reserved_after"] = torch.cuda.memory_reserved()
free, total = torch.cuda.mem_get_info(); res["mem_get_info"] = [free, total]
if before is not None and res["nvidia_smi_after_matmul_mib"] is not None:
    res["context_bytes"] = (res["nvidia_smi_after_matmul_mib"] - before) * 2**20 - res["reserved_after"]
print("PROBE " + json.dumps(res))
PY

cat >"$WORK/session.py" <<'PY'
"""GovernedSession on the GPU: outputs vs generate(), peak allocated/reserved vs the budget."""
import json, sys, time
import torch
from memwarden.models import zoo
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.host_memory import state_bytes
name, factor, stream = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "stream"
model = zoo.build_model(name, "small").to("cuda")
gk = zoo.generate_kwargs(name)
inputs = {k: v.to("cuda") for k, v in zoo.make_inputs(model, prompt_tokens=40).items()}
weights = state_bytes(model)
with torch.inference_mode():
    t0 = time.perf_counter(); ref = model.generate(**inputs, max_new_tokens=16, **gk); torch.cuda.synchronize()
    plain_s = time.perf_counter() - t0
torch.cuda.synchronize(); torch.cuda.empty_cache()
base = torch.cuda.memory_allocated() - weights
budget = int(weights * factor)
with torch.inference_mode():
    s = GovernedSession(model, budget=budget, stream=True if stream else "auto", min_kv_tokens=256,
                        example_inputs=dict(inputs, max_new_tokens=16))
    torch.cuda.synchronize()
    setup_slack = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()  # vs benchmarks/bench_cuda_stream_slack.py
    torch.cuda.reset_peak_memory_stats()  # serving only: the weights were there before
    outs, times = [], []
    for _ in range(3):
        t0 = time.perf_counter(); outs.append(s.generate(**inputs, max_new_tokens=16, **gk)); torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak_alloc = torch.cuda.max_memory_allocated() - base
    peak_res = torch.cuda.max_memory_reserved() - base  # inputs and cuBLAS workspaces are not the session's
    st = s.streamer.stats if s.streamer is not None else None
    repacked = getattr(s.streamer, "repacked_bytes", 0)
    fraction = torch.cuda.get_per_process_memory_fraction()
    mstats = torch.cuda.memory_stats()
    limit_events = [e["label"] for e in s.events if "limit refused" in e["label"] or "reserve capped" in e["label"]]
    s.close()
    after = model.generate(**inputs, max_new_tokens=16, **gk)
res = dict(model=f"{name}/small/{'streamed' if stream else 'resident'}", budget=budget, weights=weights,
           equal=all(torch.equal(o, ref) for o in outs) and torch.equal(after, ref),
           peak_allocated=peak_alloc, peak_reserved=peak_res, base_allocated=base, plain_s=round(plain_s, 4),
           session_s=[round(t, 4) for t in times], pool_device=str(s.pool.data.device),
           cap_fraction=fraction, fraction_after=torch.cuda.get_per_process_memory_fraction(),
           alloc_retries=mstats.get("num_alloc_retries", 0), ooms=mstats.get("num_ooms", 0),
           repacked_bytes=repacked, limit_events=limit_events, setup_slack=setup_slack,
           stream=None if st is None else dict(loads=st.loads, prefetch_hits=st.prefetch_hits, sync_loads=st.sync_loads,
                                               reuses=st.reuses, copied_bytes=st.copied_bytes))
print("SESSION " + json.dumps(res))
PY

run_model() {  # name size mode fixture-dir
  say "capture $1/$2/$3"
  timeout 150 python3 "$WORK/check.py" "$@" >"$WORK/one.out" 2>>"$LOG"
  local rc=$?
  cat "$WORK/one.out" >>"$LOG"
  grep '^RESULT ' "$WORK/one.out" | sed 's/^RESULT //' >>"$RESULTS" || echo "{\"model\": \"$1/$2/$3\", \"error\": \"rc=$rc\"}" >>"$RESULTS"
}
mkdir -p "$OUT/fixtures"
run_model llava tiny forward "$OUT/fixtures"
run_model llava small generate -
mkdir -p "$OUT/fixtures-qwen"
run_model qwen2-vl small generate "$OUT/fixtures-qwen"

say "probe: CUDA context and cuBLAS workspaces"
timeout 120 python3 "$WORK/probe.py" >"$WORK/probe.out" 2>>"$LOG"; cat "$WORK/probe.out" >>"$LOG"
grep '^PROBE ' "$WORK/probe.out" | sed 's/^PROBE //' >"$OUT/probe.json"

SESSIONS="$OUT/sessions.jsonl"; : >"$SESSIONS"
for spec in "llava 1.6 resident" "qwen2-vl 1.6 resident" "llava 0.75 stream" "qwen2-vl 0.75 stream"; do
  say "session $spec"
  timeout 150 python3 "$WORK/session.py" $spec >"$WORK/session.out" 2>>"$LOG"; rc=$?
  cat "$WORK/session.out" >>"$LOG"
  grep '^SESSION ' "$WORK/session.out" | sed 's/^SESSION //' >>"$SESSIONS" || echo "{\"model\": \"$spec\", \"error\": \"rc=$rc\"}" >>"$SESSIONS"
done

say "pytest -m cuda"
CUDA_TESTS=$(grep -l "mark.cuda" tests/test_*.py | tr '\n' ' ')
timeout 200 python3 -m pytest -m cuda -q -p no:cacheprovider -rfEs $CUDA_TESTS >"$OUT/pytest-cuda.log" 2>&1
PYTEST_RC=$?
cat "$OUT/pytest-cuda.log" >>"$LOG"
PYTEST_LINE=$(tail -n 1 "$OUT/pytest-cuda.log")
say "pytest rc=$PYTEST_RC: $PYTEST_LINE"

python3 - "$RESULTS" "$PYTEST_RC" "$PYTEST_LINE" "$(($(date +%s) - start))" "$SESSIONS" >"$OUT/table.txt" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
sessions = [json.loads(line) for line in open(sys.argv[5]) if line.strip()]
mib = lambda b: f"{b / 2**20:9.2f}"
print(f"{'run':<26} {'check':<28} {'memwarden MiB':>13} {'torch MiB':>10} {'diff':>9}  ok")
for r in rows:
    if "error" in r:
        print(f"{r['model']:<26} {'capture':<28} {'-':>13} {'-':>10} {'-':>9}  FAIL ({r['error']})")
        continue
    checks = [("peak vs max_memory_allocated", r["capture_peak"], r["max_memory_allocated"], 0.01),
              ("trace reserved vs max_reserved", r["trace_reserved"], r["max_memory_reserved"], 0.0),
              ("model reserved vs max_reserved", r["model_reserved"], r["max_memory_reserved"], 0.0),
              ("model alloc vs max_allocated", r["model_allocated"], r["max_memory_allocated"], 0.0)]
    for label, ours, real, tol in checks:
        diff = (ours - real) / real if real else 0.0
        ok = abs(diff) <= tol
        print(f"{r['model']:<26} {label:<28} {mib(ours):>13} {mib(real):>10} {diff:+9.3%}  {'ok' if ok else 'FAIL'}")
for r in sessions:
    if "error" in r:
        print(f"{r['model']:<26} {'session':<28} {'-':>13} {'-':>10} {'-':>9}  FAIL ({r['error']})")
        continue
    print(f"{r['model']:<26} {'outputs == generate()':<28} {'':>13} {'':>10} {'':>9}  {'ok' if r['equal'] else 'FAIL'}")
    for label, ours in (("peak allocated vs budget", r["peak_allocated"]), ("peak reserved vs budget", r["peak_reserved"])):
        diff = (ours - r["budget"]) / r["budget"]
        print(f"{r['model']:<26} {label:<28} {mib(ours):>13} {mib(r['budget']):>10} {diff:+9.3%}  {'ok' if ours <= r['budget'] else 'OVER'}")
    cap = r.get("cap_fraction", 1.0)
    note = f"cap {cap:.5f}, put back {r.get('fraction_after')}, {r.get('alloc_retries')} retries, {r.get('ooms')} OOMs"
    print(f"{r['model']:<26} {'reserve cap':<28} {note:<60}  {'ok' if cap < 1 and r.get('fraction_after') == 1.0 else 'FAIL'}")
    print(f"{r['model']:<26} {'time: session / generate()':<28} {min(r['session_s']) / r['plain_s']:>13.2f}")
    print(f"{r['model']:<26} {'reserved-allocated at setup':<28} {mib(r.get('setup_slack', 0)):>13}"
          f"  repacked {mib(r.get('repacked_bytes', 0)).strip()} MiB")
print(f"{'pytest -m cuda':<26} {sys.argv[3][:60]:<60}  {'ok' if sys.argv[2] == '0' else 'FAIL'}")
print(f"total {sys.argv[4]} s")
PY
cat "$OUT/table.txt" | tee -a "$LOG"
