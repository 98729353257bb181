#!/bin/bash
cd "$(dirname "$0")/../.."
mkdir -p "${OUTDIR:-/tmp/onnx_heldout/part}"
for m in vit whisper_enc gpt2 clip resnet mobilenet_v2 bert llama_ext t5_enc resnet_fp16 vit_fp16 bert_fp16 odd_ops custom_op; do
  for p in galaxy-s24-ultra-12gb jetson-orin-nx-16gb iphone-15-pro galaxy-s24-ultra-12gb:fp16; do
    dev=${p%%:*}; dt=auto; [[ $p == *:fp16 ]] && dt=fp16
    s=$(date +%s.%N)
    .venv/bin/python -m memwarden partition ${MODELS:-/tmp/onnx_heldout/models}/$m.onnx --device-profile $dev --dtype $dt --inputs ${MODELS:-/tmp/onnx_heldout/models}/$m.npz --json > ${OUTDIR:-/tmp/onnx_heldout/part}/${m}__${dev}__$dt.json 2> ${OUTDIR:-/tmp/onnx_heldout/part}/${m}__${dev}__$dt.err
    echo "$m $dev $dt rc=$? wall=$(echo "$(date +%s.%N) - $s" | bc)"
  done
done
