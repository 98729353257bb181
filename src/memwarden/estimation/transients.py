"""The runtime transients of a quantization method, one cited line each, for the card.

Each line is the bytes of the largest converted Linear (the one a kernel works on at a time),
and says whether the meta run already holds it in the peak (the emulated kernels of
:class:`memwarden.estimation.stored.StoredLinear`) or it comes on top on that runtime. Pure.
"""

from __future__ import annotations

from typing import Any

from memwarden.estimation.quantized import Scheme

__all__ = ["method_transients"]


def _line(what: str, nbytes: int, in_peak: bool, source: str) -> dict[str, Any]:
    return {"what": what, "bytes": int(nbytes), "in_peak": in_peak, "source": source}


def method_transients(
    scheme: Scheme, in_out: tuple[int, int], dtype_bytes: int, prefill_rows: int
) -> list[dict[str, Any]]:
    """Lines for ``scheme`` given the largest converted Linear ``in_out`` = (in, out) and the rows
    (batch x tokens) of the prefill's matmuls."""
    in_f, out_f = in_out
    dense = in_f * out_f * dtype_bytes  # (out, in) in the compute dtype
    m, out = scheme.method, []
    if m == "bitsandbytes-4bit":
        out.append(
            _line(
                "dequantize_4bit: each Linear's weight dequantized per forward with more than one token",
                dense if prefill_rows > 1 else 0,
                True,
                "bitsandbytes autograd/_functions.py matmul_4bit (gemv_4bit for one token)",
            )
        )
        if scheme.double_quant:
            out.append(
                _line(
                    "double quant: absmax dequantized to fp32 first",
                    in_f * out_f // 64 * 4,
                    False,
                    "bitsandbytes functional.py dequantize_4bit (nested absmax)",
                )
            )
    elif m == "bitsandbytes-8bit":
        out.append(
            _line(
                "LLM.int8: activations quantized to int8 and an int32 product",
                prefill_rows * (in_f + 4 * out_f),
                True,
                "bitsandbytes autograd/_functions.py MatMul8bitLt (int8_vectorwise_quant, int8_linear_matmul)",
            )
        )
    elif m == "awq":
        out.append(
            _line(
                "AWQ GEMM: weight dequantized to fp16 when a call has >= 1024 rows",
                dense if prefill_rows >= 1024 and scheme.variant == "gemm" else 0,
                True,
                "AutoAWQ awq/modules/linear/gemm.py FP16_MATMUL_HEURISTIC_CONDITION",
            )
        )
        out.append(
            _line(
                "Marlin/ExLlama repack at load: the largest layer's packed weight held twice for a moment",
                in_f * out_f * scheme.bits // 8,
                False,
                "GPTQModel nn_modules/qlinear/marlin.py post_init (repack)",
            )
        )
    elif m == "gptq":
        out.append(
            _line(
                "ExLlamaV2 scratch: the largest weight reconstructed to fp16 (allocated once, kept)",
                in_f * out_f * 2,
                prefill_rows > 50,
                "auto-gptq nn_modules/qlinear/qlinear_exllamav2.py ExLlamaV2DeviceTensors (temp_dq); "
                "MAX_Q_GEMM_ROWS = 50",
            )
        )
        out.append(
            _line(
                "Marlin workspace (int32, out/64 x 16) when the Marlin kernel is picked",
                out_f // 64 * 16 * 4,
                False,
                "GPTQModel nn_modules/qlinear/marlin.py marlin_make_workspace",
            )
        )
        out.append(
            _line(
                "Marlin repack at load: the largest layer's packed weight held twice for a moment",
                in_f * out_f * scheme.bits // 8,
                False,
                "GPTQModel nn_modules/qlinear/marlin.py post_init (repack)",
            )
        )
    elif m == "fp8" or scheme.variant in ("float-quantized", "int-quantized"):
        out.append(
            _line(
                "activation quantization: the input to each Linear in 1 byte per value",
                prefill_rows * in_f,
                True,
                "transformers integrations/finegrained_fp8.py fp8_linear (act_quant); vLLM scaled_fp8_quant",
            )
        )
    elif m == "hqq":
        out.append(
            _line(
                "HQQ (PYTORCH backend): each Linear's weight dequantized to the compute dtype on every call",
                dense,
                True,
                "hqq core/quantize.py HQQLinear.forward_pytorch (matmul with dequantize())",
            )
        )
        out.append(
            _line(
                "HQQ dequantize: the unpacked codes and the dequantized weight alive together",
                dense,
                False,
                "hqq core/quantize.py Quantizer.dequantize (unpack, then (W_r - zero) * scale)",
            )
        )
    elif m == "torchao":
        out.extend(_torchao_lines(scheme, dense, prefill_rows, in_f, out_f))
    elif scheme.variant == "pack-quantized":
        out.append(
            _line(
                "compressed-tensors: the packed weight decompressed to the compute dtype on every call",
                dense,
                True,
                "compressed-tensors linear/compressed_linear.py CompressedLinear.forward",
            )
        )
    return out


def _torchao_lines(scheme: Scheme, dense: int, rows: int, in_f: int, out_f: int) -> list[dict[str, Any]]:
    """torchao's linear on its weight subclasses (torchao 0.18 ``quantize_/workflows``), as the
    meta run holds it (``estimate.stored._kernel``)."""
    layout = scheme.variant
    if layout.startswith("int4"):
        return [
            _line(
                "int4 fused kernel on the packed codes: no dequantized weight, the output only",
                0,
                True,
                "torchao workflows/int4/int4_tensor.py (mslk) and int4_tile_packed_to_4d_tensor.py "
                "(aten._weight_int4pack_mm)",
            )
        ]
    if scheme.more is not None and scheme.more.act_quant:
        act = rows * in_f * 1 + (rows * out_f * 4 if layout == "int8" else 0)
        return [
            _line(
                "dynamic activation quantization: the input in 1 byte per value"
                + (" and an int32 product" if layout == "int8" else "")
                + "; no dequantized weight",
                act,
                True,
                "torchao workflows/int8/int8_tensor.py linear (int_scaled_matmul); float8/float8_tensor.py",
            ),
        ]
    return [
        _line(
            "weight-only: each Linear's weight converted to the compute dtype on every call",
            dense,
            True,
            "torchao workflows/int8/int8_tensor.py linear (qdata.to(output_dtype)); float8_tensor.py and "
            "intx_unpacked_to_int8_tensor.py linear (dequantize())",
        )
    ]
