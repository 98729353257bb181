"""Shrinking a real config.json to a tiny random-weight model of the same architecture (tests)."""

from __future__ import annotations

from typing import Any

_LAYERS = (
    "num_hidden_layers",
    "depth",
    "num_layers",
    "encoder_layers",
    "decoder_layers",
    "resampler_depth",
    "num_global_layers",
)
_WIDTHS = ("hidden_size", "embed_dim", "d_model", "out_hidden_size", "projection_dim", "mm_hidden_size")
_FFN = ("intermediate_size", "encoder_ffn_dim", "decoder_ffn_dim", "moe_intermediate_size")
_HEADS = {
    "num_attention_heads": 4,
    "num_heads": 4,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "resampler_n_heads": 4,
    "attention_heads": 4,
}
_KV_HEADS = ("num_key_value_heads",)


def shrink(data: Any, image_side: int | None = None) -> Any:
    """A copy of ``data`` with 2 layers, width 64, 4 heads; the vision image side set to ``image_side``."""
    if isinstance(data, list):
        return [shrink(v, image_side) for v in data]
    if not isinstance(data, dict):
        return data
    out = {k: shrink(v, image_side) for k, v in data.items()}
    for key in _LAYERS:
        if isinstance(out.get(key), int):
            out[key] = min(out[key], 2)
    for key in _WIDTHS:
        if isinstance(out.get(key), int):
            out[key] = 64
    for key in _FFN:
        if isinstance(out.get(key), int):
            out[key] = 128
    for key, heads in _HEADS.items():
        if isinstance(out.get(key), int):
            out[key] = heads
    for key in _KV_HEADS:
        if isinstance(out.get(key), int):
            out[key] = 2
    if isinstance(out.get("head_dim"), int):
        out["head_dim"] = 16
    if isinstance(out.get("resampler_head_dim"), int):
        out["resampler_head_dim"] = 16
    if isinstance(out.get("layer_types"), list):
        out["layer_types"] = out["layer_types"][:2]
    for key in ("deepstack_visual_indexes", "fullatt_block_indexes", "cross_attention_layers"):
        if isinstance(out.get(key), list):
            out[key] = [1] if out[key] else []
    if isinstance(out.get("intermediate_layers_indices"), list) and isinstance(out.get("vision_output_dim"), int):
        # Mllama's tower: the last hidden state beside each kept intermediate one, concatenated
        out["intermediate_layers_indices"] = [0, 1]
        out["vision_output_dim"] = out["hidden_size"] * 3
    rope = out.get("rope_parameters") or out.get("rope_scaling")
    if isinstance(rope, dict) and isinstance(rope.get("mrope_section"), list):
        # the sections sum to the rotary half-width: head_dim 16 / 2 = 8, times a partial rotary factor
        partial = out.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
        half = int(16 * partial) // 2 if isinstance(partial, (int, float)) else 8
        rope["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]
    if image_side is not None and isinstance(out.get("image_size"), int) and "patch_size" in out:
        old = out["image_size"]
        out["image_size"] = image_side
        out["_scale"] = image_side / old
    if isinstance(out.get("image_size"), list) and image_side is not None:
        out["image_size"] = [image_side, image_side]
    return out


def tiny_config(data: dict[str, Any], image_side: int | None = None) -> dict[str, Any]:
    """The whole config shrunk; grid pinpoints follow the vision side."""
    out = shrink(data, image_side)
    vc = out.get("vision_config") or {}
    scale = vc.pop("_scale", None)
    if scale and isinstance(out.get("image_grid_pinpoints"), list):
        out["image_grid_pinpoints"] = [[round(a * scale), round(b * scale)] for a, b in out["image_grid_pinpoints"]]
    return out
