#!/bin/bash
# usage: run_cli.sh MODEL_BASENAME  (models built by build_models.py in $MODELS); logs to $OUTDIR/NAME/
cd "$(dirname "$0")/../.."
M=${MODELS:-/tmp/onnx_heldout/models}/$1.onnx; F=${MODELS:-/tmp/onnx_heldout/models}/$1.npz; O=${OUTDIR:-/tmp/onnx_heldout/out}/$1; mkdir -p $O
mw() { local tag=$1; shift; timeout 600 .venv/bin/python -m memwarden "$@" > $O/$tag.out 2> $O/$tag.err; local rc=$?
  local tb=$(grep -c Traceback $O/$tag.err $O/$tag.out | awk -F: '{s+=$2} END {print s}')
  echo "$1 $tag rc=$rc tb=$tb :: $(tail -1 $O/$tag.err | cut -c1-150)"; }
for s in "on on" "off off" "off on"; do set -- $s; t=a$1_p$2
  mw trace_$t trace --onnx $M --inputs $F --arena $1 --mem-pattern $2 -o $O/$t.mwtrace
done
T=$O/aon_pon.mwtrace
mw summary summary $T; mw diagnose diagnose --json $T; mw report report $T -o $O/r.html; mw replay replay $T; mw plan plan $T
mw summary_off summary $O/aoff_poff.mwtrace
