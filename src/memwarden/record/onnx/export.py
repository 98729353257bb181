"""Export a zoo VLM to ONNX in the three parts an edge deployment runs: ``vision`` (the vision
tower and the projector: pixels -> image features), ``prefill`` (the decoder and LM head on the
merged prompt embeddings, returning logits and the KV cache) and ``decode`` (one token's
embedding plus the KV cache in, logits and the grown cache out).

Usage::

    from memwarden.record.onnx.export import export_zoo
    parts = export_zoo("llava", "out/")          # {"vision": Path, "prefill": Path, "decode": Path}
    feeds = example_feeds("llava")               # the matching numpy feeds, one dict per part

The exporter is ``torch.onnx.export(..., dynamo=False)`` (TorchScript tracing): on these models
it works with transformers' ``DynamicCache``, where the dynamo exporter needs onnxscript and
still trips on the cache classes. Shapes are fixed (the example's); node names keep the module
scope (``/language_model/layers.0/self_attn/q_proj/MatMul``) and each file stores
``memwarden.module_prefix`` = ``model.`` (the wrapper hides the VLM's ``model.`` level) and
``memwarden.module_roots`` = ``lm_head`` (which sits beside ``model``), so the capture's module
paths are the PyTorch ones, plus ``memwarden.phase`` / ``memwarden.part`` /
``memwarden.model`` for the capture's phase and name.

KV inputs are ``past_key_values.{i}.key|value`` and outputs ``present.{i}.key|value``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memwarden.errors import InputError
from memwarden.models.zoo import build_model
from memwarden.models.zoo.inputs import make_inputs

__all__ = ["PARTS", "example_feeds", "export_parts", "export_zoo"]

PARTS = ("vision", "prefill", "decode")
_PHASE = {"vision": "encode", "prefill": "prefill", "decode": "decode"}
_OPSET = 17


class _Vision(torch.nn.Module):
    """Vision tower + projector: ``pixel_values`` (and a grid for Qwen2-VL) -> image features."""

    def __init__(self, vlm: Any, grid: torch.Tensor | None) -> None:
        super().__init__()
        self.model = vlm.model
        self.grid = grid  # Qwen2-VL's image_grid_thw: fixed at export (it drives Python loops)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if self.grid is not None:
            out = self.model.get_image_features(pixel_values=pixel_values, image_grid_thw=self.grid)
        else:
            out = self.model.get_image_features(pixel_values=pixel_values)
        out = getattr(out, "pooler_output", out)
        if isinstance(out, list | tuple):
            out = torch.cat(list(out), 0)
        return out


class _Decoder(torch.nn.Module):
    """Decoder + LM head over embeddings, with the KV cache as flat tensors in and out."""

    def __init__(self, vlm: Any) -> None:
        super().__init__()
        self.model = vlm.model
        self.lm_head = vlm.lm_head

    def forward(
        self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        cache = DynamicCache()
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model.language_model(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask, past_key_values=cache, use_cache=True
        )
        logits = self.lm_head(out.last_hidden_state)  # (B, T, vocab)
        flat: list[torch.Tensor] = []
        for layer in out.past_key_values.layers:
            flat += [layer.keys, layer.values]  # (B, kv_heads, T_total, head_dim) each
        return (logits, *flat)


def _example(name: str, size: str) -> tuple[Any, dict[str, torch.Tensor]]:
    vlm = build_model(name, size=size)
    if not hasattr(vlm.model, "get_image_features") or not hasattr(vlm.model, "language_model"):
        raise InputError(f"{name}: not a vision-language zoo model (no vision tower + language model to export)")
    return vlm, make_inputs(name, size=size)


def export_parts(
    name: str, size: str
) -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[str], list[str]]]:
    """Per part: the wrapper module, its example inputs, input names and output names."""
    vlm, x = _example(name, size)
    grid = x.get("image_grid_thw")
    vision = _Vision(vlm, grid)
    decoder = _Decoder(vlm)
    layers = vlm.config.get_text_config().num_hidden_layers
    embed = vlm.model.get_input_embeddings()
    with torch.no_grad():
        prompt = embed(x["input_ids"])  # (B, T, hidden): placeholders stay text embeddings; memory is the same
        prefill_out = decoder(prompt, x["attention_mask"])
    past = tuple(prefill_out[1:])
    token = embed(torch.tensor([[x["input_ids"][0, -1].item()]]))  # (1, 1, hidden)
    mask = torch.ones(1, x["attention_mask"].shape[1] + 1, dtype=x["attention_mask"].dtype)
    kv_in = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    kv_out = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    return {
        "vision": (vision, (x["pixel_values"],), ["pixel_values"], ["image_features"]),
        "prefill": (
            decoder,
            (prompt.detach(), x["attention_mask"]),
            ["inputs_embeds", "attention_mask"],
            ["logits", *kv_out],
        ),
        "decode": (
            decoder,
            (token.detach(), mask, *past),
            ["inputs_embeds", "attention_mask", *kv_in],
            ["logits", *kv_out],
        ),
    }


def export_zoo(
    name: str, out_dir: str | Path, *, size: str = "tiny", parts: tuple[str, ...] = PARTS
) -> dict[str, Path]:
    """Export zoo model ``name``'s ``parts`` to ``out_dir/<name>-<part>.onnx``; returns the paths."""
    import onnx

    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise InputError(f"unknown part(s) {unknown}; valid: {', '.join(PARTS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for part, (module, args, input_names, output_names) in export_parts(name, size).items():
        if part not in parts:
            continue
        path = out / f"{name}-{part}.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer warnings about Python control flow: shapes are fixed
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=False,
                opset_version=_OPSET,
                input_names=input_names,
                output_names=output_names,
            )
        model = onnx.load(str(path))
        for key, value in {
            "memwarden.module_prefix": "model.",
            "memwarden.module_roots": "lm_head",
            "memwarden.phase": _PHASE[part],
            "memwarden.part": part,
            "memwarden.model": f"{name}-{part}",
        }.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(model, str(path))
        written[part] = path
    return written


def example_feeds(name: str, *, size: str = "tiny") -> dict[str, dict[str, np.ndarray]]:
    """The numpy feeds that match ``export_zoo(name)``'s parts (the export's own example inputs).

    Copies that own their memory: ``Tensor.numpy()`` shares the tensor's storage and keeps it alive,
    and a torch tensor kept alive by a feed is counted by every later live capture in the process."""
    return {
        part: {n: t.detach().numpy().copy() for n, t in zip(names, args, strict=True)}
        for part, (_, args, names, _) in export_parts(name, size).items()
    }
