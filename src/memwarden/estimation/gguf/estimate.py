"""A llama.cpp deployment estimated from its GGUF headers: every buffer llama.cpp logs, where it
lives, the peak and the verdict against a budget or a device profile.

``peak_bytes`` is what llama.cpp reserves once the model, the context and the projector are up:
the mapped weights, the KV cache (cleared at creation, so resident), the compute buffers and the
projector's weights and compute buffer. The compute buffers are reserved for the worst case and
are only partly touched, so resident memory may stay below this figure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from memwarden.estimation.gguf.buffers import (
    ContextParams,
    KVCache,
    ModelBuffers,
    compute_bytes,
    context_params,
    kv_cache,
    layer_on_gpu,
    model_buffers,
)
from memwarden.estimation.gguf.hparams import TextModel, text_model
from memwarden.estimation.gguf.mmproj import ImagePlan, Projector, image_tokens, projector
from memwarden.estimation.gguf.mmproj import compute_bytes as mmproj_compute_bytes
from memwarden.estimation.gguf.reader import read_header, type_name
from memwarden.units import format_bytes
from memwarden.untrusted import terminal_safe

__all__ = ["LlamaCppEstimate", "estimate_gguf"]


@dataclass(frozen=True, kw_only=True)
class LlamaCppEstimate:
    model: str
    mmproj: str | None
    text: TextModel
    context: ContextParams
    weights: ModelBuffers
    kv: KVCache
    compute_bytes: int
    compute_on: str  # "cpu" or "gpu"
    proj: Projector | None
    mmproj_compute_bytes: int
    mmproj_on: str
    images: tuple[ImagePlan, ...]
    budget_bytes: int | None = None
    budget_source: str | None = None  # "--budget" or the device profile's id
    judge_gpu_only: bool = False  # a discrete GPU: the verdict weighs the GPU's share
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def image_tokens(self) -> int:
        return sum(p.tokens for p in self.images)

    def buffers(self) -> list[dict[str, Any]]:
        """One row per buffer, in llama.cpp's words (the names its log lines use)."""
        rows = [
            ("model buffer (CPU_Mapped)", "weights", self.weights.cpu_mapped_bytes, "cpu"),
            ("model buffer (GPU)", "weights", self.weights.gpu_bytes, "gpu"),
            ("KV buffer (CPU)", "kv_cache", self.kv.cpu_bytes, "cpu"),
            ("KV buffer (GPU)", "kv_cache", self.kv.gpu_bytes, "gpu"),
            (f"compute buffer ({self.compute_on.upper()})", "compute", self.compute_bytes, self.compute_on),
        ]
        if self.proj is not None:
            rows += [
                ("clip model size (mmproj weights)", "mmproj_weights", self.proj.weights_bytes, self.mmproj_on),
                (
                    f"clip compute buffer ({self.mmproj_on.upper()})",
                    "mmproj_compute",
                    self.mmproj_compute_bytes,
                    self.mmproj_on,
                ),
            ]
        kept = [r for r in rows if r[2] or r[1] == "compute" or r[0] == "model buffer (CPU_Mapped)"]
        return [{"name": n, "kind": k, "bytes": b, "on": on} for n, k, b, on in kept]

    @property
    def peak_bytes(self) -> int:
        return sum(r["bytes"] for r in self.buffers())

    def on_bytes(self, where: str) -> int:
        return sum(r["bytes"] for r in self.buffers() if r["on"] == where)

    @property
    def judged_bytes(self) -> int:
        return self.on_bytes("gpu") if self.judge_gpu_only else self.peak_bytes

    @property
    def fits(self) -> bool | None:
        return None if self.budget_bytes is None else self.judged_bytes <= self.budget_bytes

    def to_json(self) -> dict[str, Any]:
        mmproj_w = self.proj.weights_bytes if self.proj else 0
        llama = {
            # the names (llama.cpp's log lines) ...
            "model_buffer_bytes": self.weights.cpu_mapped_bytes + self.weights.gpu_bytes,
            "kv_buffer_bytes": self.kv.total_bytes,
            "compute_buffer_bytes": self.compute_bytes,
            "mmproj_buffer_bytes": mmproj_w,
            # ... and the same figures by what they hold
            "weights_bytes": self.weights.cpu_mapped_bytes + self.weights.gpu_bytes,
            "kv_cache_bytes": self.kv.total_bytes,
            "compute_bytes": self.compute_bytes,
            "mmproj_weights_bytes": mmproj_w,
            "mmproj_compute_bytes": self.mmproj_compute_bytes,
            "image_tokens": self.image_tokens,
            "images": [
                {"width": p.width, "height": p.height, "tokens": p.tokens, "encoded": [list(e) for e in p.encodes]}
                for p in self.images
            ],
            "buffers": self.buffers(),
            "placement": {"cpu_bytes": self.on_bytes("cpu"), "gpu_bytes": self.on_bytes("gpu")},
            "weights_by_type": dict(sorted(self.weights.by_type.items())),
            "context": {
                "n_ctx": self.context.n_ctx,
                "n_ctx_seq": self.context.n_ctx_seq,
                "n_seq_max": self.context.n_seq_max,
                "n_batch": self.context.n_batch,
                "n_ubatch": self.context.n_ubatch,
                "flash_attn": self.context.flash_attn,
                "cache_type_k": type_name(self.context.type_k).lower(),
                "cache_type_v": type_name(self.context.type_v).lower(),
                "n_gpu_layers": self.context.n_gpu_layers,
                "kv_cells": self.kv.cells,
                "kv_swa_cells": self.kv.swa_cells,
            },
            "model": {
                "arch": self.text.arch,
                "n_layer": self.text.n_layer,
                "n_embd": self.text.n_embd,
                "n_vocab": self.text.n_vocab,
                "n_ctx_train": self.text.n_ctx_train,
                "n_swa": self.text.n_swa,
            },
            "projector": None
            if self.proj is None
            else {
                "type": self.proj.proj_type,
                "warmup_image_size": self.proj.warmup_size,
                "min_pixels": self.proj.min_pixels,
                "max_pixels": self.proj.max_pixels,
            },
        }
        return {
            "runtime": "llama.cpp",
            "model": self.model,
            "mmproj": self.mmproj,
            "llama_cpp": llama,
            "peak_bytes": self.peak_bytes,
            "budget_bytes": self.budget_bytes,
            "budget_source": self.budget_source,
            "judged_bytes": self.judged_bytes,
            "fits": self.fits,
            "headroom_bytes": None if self.budget_bytes is None else self.budget_bytes - self.judged_bytes,
            "notes": list(self.notes),
        }

    def to_text(self) -> str:
        c = self.context
        lines = [
            f"{terminal_safe(os.path.basename(self.model))} (llama.cpp, {self.text.arch}): peak {format_bytes(self.peak_bytes)}",
            f"  n_ctx = {c.n_ctx}, n_batch = {c.n_batch}, n_ubatch = {c.n_ubatch}, n_seq_max = {c.n_seq_max}, "
            f"flash_attn = {'on' if c.flash_attn else 'off'}, K {type_name(c.type_k).lower()}, "
            f"V {type_name(c.type_v).lower()}, -ngl {c.n_gpu_layers}",
        ]
        for r in self.buffers():
            lines.append(f"  {r['name']:<36} {format_bytes(r['bytes']):>12}  {r['on']}")
        for p in self.images:
            lines.append(
                f"  image {p.width}x{p.height}: {p.tokens} image tokens ({len(p.encodes)} encoder pass"
                f"{'es' if len(p.encodes) > 1 else ''}, {p.encodes[0][0]}x{p.encodes[0][1]} px)"
            )
        if self.budget_bytes is not None:
            what = "GPU share" if self.judge_gpu_only else "peak"
            head = self.budget_bytes - self.judged_bytes
            verdict = (
                f"fits ({format_bytes(head)} headroom)" if head >= 0 else f"does not fit ({format_bytes(-head)} over)"
            )
            lines.append(f"  {self.budget_source}: {format_bytes(self.budget_bytes)}, {what} {verdict}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def estimate_gguf(
    model_path: str,
    *,
    mmproj_path: str | None = None,
    images: tuple[tuple[int, int], ...] = (),
    n_ctx: int = 0,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    flash_attn: str = "auto",
    n_gpu_layers: int = 0,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    n_parallel: int = 1,
    image_min_tokens: int = -1,
    image_max_tokens: int = -1,
    mmproj_offload: bool = True,
    budget_bytes: int | None = None,
    device: Any = None,
) -> LlamaCppEstimate:
    """Every buffer llama.cpp (``llama-mtmd-cli`` / ``llama-server`` with these flags) would
    allocate for ``model_path`` (and ``mmproj_path``), from the headers alone."""
    header = read_header(model_path)
    text = text_model(header)
    cp = context_params(
        text,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_parallel=n_parallel,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        flash_attn=flash_attn,
        n_gpu_layers=n_gpu_layers,
    )
    weights = model_buffers(header, text, cp.n_gpu_layers)
    kv = kv_cache(text, cp)
    notes: list[str] = []
    # the graph runs where the output layer lives once any layer is offloaded (the scheduler puts
    # each op on its weights' backend; the largest tensors, the logits, follow the output layer)
    compute_on = "gpu" if cp.n_gpu_layers and layer_on_gpu(text.n_layer, text.n_layer, cp.n_gpu_layers) else "cpu"
    proj = None
    plans: tuple[ImagePlan, ...] = ()
    mm_compute = 0
    mm_on = "gpu" if cp.n_gpu_layers and mmproj_offload else "cpu"
    if mmproj_path is not None:
        proj = projector(read_header(mmproj_path), image_min_tokens=image_min_tokens, image_max_tokens=image_max_tokens)
        plans = tuple(image_tokens(proj, w, h) for w, h in images)
        # clip.cpp warmup: CLIP_FLASH_ATTN_TYPE_AUTO tries flash attention first (the CPU backend has it)
        mm_compute = mmproj_compute_bytes(proj, flash_attn != "off")
        if proj.proj_dim and proj.proj_dim != text.n_embd:
            notes.append(f"projector output {proj.proj_dim} != model n_embd {text.n_embd}: llama.cpp refuses this pair")
    elif images:
        notes.append("--image without --mmproj: no image tokens counted")
    tokens = sum(p.tokens for p in plans)
    if tokens > cp.n_ctx_seq:
        notes.append(f"{tokens} image tokens exceed the context of {cp.n_ctx_seq} per sequence")
    if tokens and any(p.tokens > cp.n_batch for p in plans) and proj is not None and proj.proj_type in ("gemma3",):
        notes.append("an image's tokens exceed -b: llama.cpp needs them in one batch (non-causal image attention)")
    source = None
    judge_gpu = False
    if budget_bytes is None and device is not None:
        budget_bytes, source = int(device.usable_bytes), str(device.id)
        judge_gpu = bool(cp.n_gpu_layers) and not bool(getattr(device, "unified_memory", True))
    elif budget_bytes is not None:
        source = "--budget"
    return LlamaCppEstimate(
        model=model_path,
        mmproj=mmproj_path,
        text=text,
        context=cp,
        weights=weights,
        kv=kv,
        compute_bytes=compute_bytes(text, cp, kv),
        compute_on=compute_on,
        proj=proj,
        mmproj_compute_bytes=mm_compute,
        mmproj_on=mm_on,
        images=plans,
        budget_bytes=budget_bytes,
        budget_source=source,
        judge_gpu_only=judge_gpu,
        notes=tuple(notes),
    )
