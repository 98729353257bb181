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
timeout 240 python3 -m memwarden.capture.native --build >>"$LOG" 2>&1 || say "native build FAILED"

cat >"$WORK/check.py" <<'PY'
"""One model, one fresh process: capture on CUDA, compare with torch's counters and the model."""
import json, pickle, sys, time
import torch
from memwarden.analyze.timeline import summary
from memwarden.capture.cuda.capture import MARKER_END_BYTES, MARKER_START_BYTES, capture_cuda
from memwarden.capture.cuda.merge import peak_reserved_bytes
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
run_model qwen2-vl small generate -

say "pytest -m cuda"
CUDA_TESTS=$(grep -l "mark.cuda" tests/test_*.py | tr '\n' ' ')
timeout 200 python3 -m pytest -m cuda -q -p no:cacheprovider -rfEs $CUDA_TESTS >"$OUT/pytest-cuda.log" 2>&1
PYTEST_RC=$?
cat "$OUT/pytest-cuda.log" >>"$LOG"
PYTEST_LINE=$(tail -n 1 "$OUT/pytest-cuda.log")
say "pytest rc=$PYTEST_RC: $PYTEST_LINE"

python3 - "$RESULTS" "$PYTEST_RC" "$PYTEST_LINE" "$(($(date +%s) - start))" >"$OUT/table.txt" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
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
print(f"{'pytest -m cuda':<26} {sys.argv[3][:60]:<60}  {'ok' if sys.argv[2] == '0' else 'FAIL'}")
print(f"total {sys.argv[4]} s")
PY
cat "$OUT/table.txt" | tee -a "$LOG"
