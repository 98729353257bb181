"""The buffers llama.cpp allocates for a language model: model (weights), KV cache, compute.

Each is sized as llama.cpp sizes it (sources cited per function, llama.cpp ``src/``), from the
header alone. Figures are bytes; "cpu"/"gpu" say where a buffer lives under ``-ngl``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memwarden.errors import InputError
from memwarden.estimation.gguf.hparams import TextModel
from memwarden.estimation.gguf.reader import QUANT_SIZES, GGUFHeader, row_bytes, type_id, type_name

__all__ = ["ContextParams", "KVCache", "ModelBuffers", "compute_bytes", "context_params", "kv_cache", "model_buffers"]

# common/arg.cpp kv_cache_types: the types -ctk / -ctv accept
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
F32, F16 = 0, 1
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _pad(n: int, multiple: int) -> int:
    """GGML_PAD: ``n`` rounded up to a multiple."""
    return -(-n // multiple) * multiple


@dataclass(frozen=True, kw_only=True)
class ContextParams:
    """llama_context's cparams after its constructor (llama-context.cpp, llama_context::llama_context)."""

    n_ctx: int  # GGML_PAD(requested or n_ctx_train, 256), then n_ctx_seq x n_seq_max
    n_ctx_seq: int  # cells per sequence stream
    n_seq_max: int  # --parallel
    n_batch: int  # min(n_ctx, -b) with causal attention
    n_ubatch: int  # min(n_batch, -ub)
    flash_attn: bool
    type_k: int
    type_v: int
    n_gpu_layers: int  # layers whose weights, KV and compute live on the GPU (0: CPU only)


def cache_type(name: str, flag: str) -> int:
    if name.lower() not in KV_CACHE_TYPES:
        raise InputError(
            f"{flag} {name!r}: llama.cpp accepts {', '.join(KV_CACHE_TYPES)} (common/arg.cpp kv_cache_types)"
        )
    return type_id(name)


def context_params(
    model: TextModel,
    *,
    n_ctx: int = 0,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    n_parallel: int = 1,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    flash_attn: str = "auto",
    n_gpu_layers: int = 0,
) -> ContextParams:
    """The context llama.cpp would build for these flags (defaults are common/common.h's)."""
    if n_parallel < 1 or n_parallel > 256:  # LLAMA_MAX_SEQ
        raise InputError(f"--parallel {n_parallel}: llama.cpp takes 1 to 256 sequences (LLAMA_MAX_SEQ)")
    if n_batch < 1 or n_ubatch < 1:
        raise InputError("--batch and --ubatch take a positive number of tokens")
    type_k, type_v = cache_type(cache_type_k, "--cache-type-k"), cache_type(cache_type_v, "--cache-type-v")
    quantized_v = QUANT_SIZES[type_v][0] > 1
    # llama-context.cpp llama_init_from_model: a quantized V cache turns "auto" flash attention on and
    # is refused with it off ("quantized V cache requires flash_attn to be enabled"). On its CPU and
    # CUDA backends "auto" resolves to enabled (llama_context::resolve_fused_ops probes the op).
    if quantized_v and flash_attn == "off":
        raise InputError(
            f"--cache-type-v {cache_type_v}: llama.cpp refuses a quantized V cache without flash attention "
            '(llama_init_from_model: "quantized V cache requires flash_attn to be enabled"); use --flash-attn on'
        )
    fa = flash_attn != "off"
    for t, label in ((type_k, "K"), (type_v, "V")):  # llama_init_from_model: the block must divide the head size
        block = QUANT_SIZES[t][0]
        head = model.head_dim_k if label == "K" else model.head_dim_v
        if fa and block > 1 and head % block:
            raise InputError(
                f"{label} cache type {type_name(t)} with block size {block} does not divide the head size {head}"
            )
    # llama_context::llama_context: n_ctx = GGML_PAD(n_ctx, 256); per-sequence streams padded again
    ctx = _pad(n_ctx if n_ctx > 0 else model.n_ctx_train, 256)
    ctx_seq = _pad(ctx // n_parallel, 256) if n_parallel > 1 else ctx
    ctx = ctx_seq * n_parallel
    batch = min(ctx, n_batch)
    return ContextParams(
        n_ctx=ctx,
        n_ctx_seq=ctx_seq,
        n_seq_max=n_parallel,
        n_batch=batch,
        n_ubatch=min(batch, n_ubatch),
        flash_attn=fa,
        type_k=type_k,
        type_v=type_v,
        n_gpu_layers=max(0, n_gpu_layers),
    )


def layer_on_gpu(il: int, n_layer: int, n_gpu_layers: int) -> bool:
    """llama-model.cpp llama_model::load_tensors: ``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)``;
    layer ``n_layer`` is the output layer, so ``-ngl 1`` offloads the output layer only. The input
    layer (token embeddings) always stays on the CPU (``dev_input``)."""
    return il >= max(n_layer + 1 - n_gpu_layers, 0)


@dataclass(frozen=True, kw_only=True)
class ModelBuffers:
    cpu_mapped_bytes: int  # "CPU_Mapped model buffer size": the file range of the CPU-resident tensors
    gpu_bytes: int  # offloaded layers' weights ("CUDA0 model buffer size")
    by_type: dict[str, int]  # bytes per ggml type as stored
    tensors: int


def model_buffers(header: GGUFHeader, model: TextModel, n_gpu_layers: int) -> ModelBuffers:
    """llama-model.cpp ``load_tensors``: with mmap (the default) the CPU buffer is the span of the
    file from the first to the last byte of the CPU tensors (``llama_model_loader::get_mapping_range``,
    wrapped by ``ggml_backend_dev_buffer_from_host_ptr``); offloaded layers get an allocated device buffer."""
    by_type: dict[str, int] = {}
    first, last, gpu = None, 0, 0
    for t in header.tensors:
        by_type[t.type_name] = by_type.get(t.type_name, 0) + t.nbytes
        match = _BLOCK.match(t.name)
        if match:
            il = int(match.group(1))
        elif t.name.startswith("output"):  # output.weight, output_norm.weight: the output layer
            il = model.n_layer
        else:  # token_embd and the rest: the input layer, always on the CPU
            il = -1
        if il >= 0 and n_gpu_layers and layer_on_gpu(il, model.n_layer, n_gpu_layers):
            gpu += _pad(t.nbytes, 32)  # ggml_backend_alloc_ctx_tensors_from_buft: each tensor aligned
            continue
        first = t.offset if first is None else min(first, t.offset)
        last = max(last, t.offset + t.nbytes)
    return ModelBuffers(
        cpu_mapped_bytes=last - (first or 0), gpu_bytes=gpu, by_type=by_type, tensors=len(header.tensors)
    )


@dataclass(frozen=True, kw_only=True)
class KVCache:
    cpu_bytes: int
    gpu_bytes: int
    cells: int  # of the full-attention layers, per stream
    swa_cells: int  # of the sliding-window layers, per stream (0: none)
    k_bytes: int
    v_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.cpu_bytes + self.gpu_bytes


def kv_cache(model: TextModel, cp: ContextParams, *, swa_full: bool = False) -> KVCache:
    """llama-kv-cache.cpp ``llama_kv_cache::llama_kv_cache``: per layer a K tensor of
    ``ggml_row_size(type_k, n_embd_k_gqa) x kv_size x n_stream`` and a V tensor alike
    (``n_stream`` = sequences unless the cache is unified; llama-context.cpp keeps ``kv_size =
    n_ctx_seq``). Sliding-window layers (llama-kv-cache-iswa.cpp ``llama_kv_cache_iswa``) get their
    own cache of ``GGML_PAD(min(n_ctx_seq, n_swa + n_ubatch), 256)`` cells. Each layer's tensors
    live on its device when offloaded (``offload_kqv``, the default)."""
    streams = cp.n_seq_max
    swa_cells = 0
    if model.n_swa:
        swa_cells = cp.n_ctx_seq if swa_full else _pad(min(cp.n_ctx_seq, model.n_swa + cp.n_ubatch), 256)
    cpu = gpu = k_total = v_total = 0
    for il in range(model.n_layer):
        cells = swa_cells if model.is_swa(il) else cp.n_ctx_seq
        k = row_bytes(cp.type_k, model.n_embd_k_gqa(il)) * cells * streams
        v = row_bytes(cp.type_v, model.n_embd_v_gqa(il)) * cells * streams
        k_total, v_total = k_total + k, v_total + v
        if cp.n_gpu_layers and layer_on_gpu(il, model.n_layer, cp.n_gpu_layers):
            gpu += k + v
        else:
            cpu += k + v
    return KVCache(
        cpu_bytes=cpu, gpu_bytes=gpu, cells=cp.n_ctx_seq, swa_cells=swa_cells, k_bytes=k_total, v_bytes=v_total
    )


def attn_rotation(model: TextModel, cp: ContextParams) -> bool:
    """llama-kv-cache.cpp ``llama_kv_cache::llama_kv_cache``: ``attn_rot_k``/``attn_rot_v`` — a
    quantized K (V) cache with a head size divisible by 64 gets Hadamard-rotated q/k (v) in the
    graph (``llm_graph_context::build_attn``, ``llama_mul_mat_hadamard``)."""
    rot_k = QUANT_SIZES[cp.type_k][0] > 1 and model.head_dim_k % 64 == 0
    rot_v = QUANT_SIZES[cp.type_v][0] > 1 and model.head_dim_v % 64 == 0
    return rot_k or rot_v


def compute_bytes(model: TextModel, cp: ContextParams, kv: KVCache) -> int:
    """The graph allocator's high-water mark for the worst-case prompt graph that
    ``llama_context::sched_reserve`` reserves: ``n_tokens = min(n_ctx, n_ubatch)`` tokens against the
    full cache (``init_full``: n_kv = kv_size), with one output per token (``n_outputs_pp =
    min(n_tokens, n_outputs_max)``, n_outputs_max = n_batch by default).

    ggml-alloc (``ggml/src/ggml-alloc.c``, ``ggml_gallocr_alloc_graph_impl``) places the graph
    inputs first and frees every tensor after its last use — the KQ masks too, after the last
    layer — except graph outputs. The peak is the larger of:

    - a layer: the inputs (masks of n_kv x n_tokens, f16 with flash attention:
      ``build_attn_inp_kq_mask``) with the attention (KQ of n_kv x n_tokens x n_head f32 without
      flash attention) or the FFN (gate and up of n_ff x n_tokens);
    - the head: the logits (n_vocab x n_outputs f32) on top of what is still held then — the token
      ids, the unselected embeddings input (``build_inp_embd`` keeps both inputs of
      ``ggml_build_forward_select``) and ``result_norm`` (an output, never freed), plus one more
      (n_tokens x n_embd) tensor when the cache is rotated (measured: +0.25 MiB at n_embd 128).

    Measured against llama-mtmd-cli (docs/llama-cpp-accuracy.md): exact to the logged 0.01 MiB
    except where the allocator's best-fit placement leaves a hole under the logits (-c 2048 with
    an f16 cache on the tiny models: 18.25 MiB logged, 16.50 estimated)."""
    n = cp.n_ubatch
    n_out = min(n, cp.n_batch)
    f32 = 4
    d = model.n_embd
    resid = d * n * f32
    mask_type = 2 if cp.flash_attn else 4  # llama-graph.cpp build_attn_inp_kq_mask: f16 for flash attention
    # n_kv x n_tokens per mask (split across streams when the cache is not unified: the same total)
    masks = kv.cells * n * mask_type
    if kv.swa_cells:
        masks += kv.swa_cells * n * mask_type
    held = n * 4 + resid  # token ids (i32) and the embeddings input, (n_embd, n_tokens) f32
    peak_layer = 0
    for il in range(model.n_layer):
        n_kv = kv.swa_cells if model.is_swa(il) else kv.cells
        heads = model.n_head[il]
        q = model.head_dim_k * heads * n * f32
        out = model.head_dim_v * heads * n * f32
        if cp.flash_attn:
            attn = resid + q + out
        else:
            kq = n_kv * n * heads * f32
            attn = resid + max(q + kq, kq + out)
        ff = model.n_ff[il]
        n_ff_tokens = n * (model.n_expert_used if model.n_expert_used else 1)
        ffn = resid * 2 + 3 * ff * n_ff_tokens * f32
        peak_layer = max(peak_layer, attn, ffn)
    rotated = model.head_dim_k * model.n_head[-1] * n * f32 if attn_rotation(model, cp) else 0
    head = held + d * n_out * f32 + model.n_vocab * n_out * f32 + rotated
    return max(held + masks + n * 4 * 2 + peak_layer, head)
