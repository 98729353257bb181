"""What llama.cpp's loader reads from a language model's GGUF metadata, as plain numbers.

Sources (llama.cpp, ``src/``): ``llama-model.cpp`` ``llama_model_base::load_hparams`` (per-layer
head counts as scalars or arrays, ``key_length``/``value_length`` defaulting to n_embd / n_head),
``llama-hparams.cpp`` ``n_embd_k_gqa``/``n_embd_v_gqa`` (head size x KV heads of the layer),
``llama-hparams.cpp`` ``set_swa_pattern`` and each architecture's ``load_arch_hparams`` in
``src/models/*.cpp`` (``load_swa_pattern(ml, n)``: the default period of sliding-window layers when
the file names ``sliding_window``), ``llama-vocab.cpp`` (the vocabulary is ``tokenizer.ggml.tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memwarden.errors import InputError
from memwarden.estimation.gguf.reader import ArrayInfo, GGUFHeader
from memwarden.untrusted import terminal_safe

__all__ = ["TextModel", "text_model"]

# src/models/<arch>.cpp load_arch_hparams: load_swa_pattern(ml, period, dense_first) when the
# file has <arch>.attention.sliding_window (> 0); the file's own sliding_window_pattern wins.
SWA_PERIOD: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "exaone4": (4, False),
    "olmo2": (4, False),
    "llama4": (4, False),
    "gpt-oss": (2, False),
    "afmoe": (4, False),
    "smallthinker": (4, True),
}
# llm_arch_is_recurrent / llm_arch_is_hybrid (src/llama-arch.cpp): their state is not a KV cache
# of context length; not modelled here, so refused rather than mis-sized.
RECURRENT = {
    "mamba",
    "mamba2",
    "rwkv6",
    "rwkv6qwen2",
    "rwkv7",
    "arwkv7",
    "jamba",
    "falcon-h1",
    "plamo2",
    "granitehybrid",
    "lfm2",
    "lfm2moe",
    "nemotron_h",
    "nemotron_h_moe",
    "qwen3next",
    "qwen35",
    "qwen35moe",
    "minimax-01",
    "kimi-linear",
}
MAX_LAYERS = 4096
MAX_DIM = 1 << 24


@dataclass(frozen=True, kw_only=True)
class TextModel:
    """The numbers llama.cpp's buffers are sized by, per layer where they vary."""

    arch: str
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_vocab: int
    n_head: tuple[int, ...]  # per layer
    n_head_kv: tuple[int, ...]  # per layer
    n_ff: tuple[int, ...]  # per layer (0: no dense FFN)
    head_dim_k: int
    head_dim_v: int
    n_swa: int = 0  # sliding window (tokens); 0: none
    swa_layers: tuple[bool, ...] = ()  # True where the layer attends within the window
    n_expert: int = 0
    n_expert_used: int = 0

    def n_embd_k_gqa(self, il: int) -> int:
        return self.head_dim_k * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.head_dim_v * self.n_head_kv[il]

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]


def _int(header: GGUFHeader, key: str, *, default: int | None = None, lo: int = 0, hi: int = MAX_DIM) -> int:
    value = header.get(key, default)
    if value is None:
        raise InputError(f"{header.path}: {terminal_safe(key)} is missing (llama.cpp needs it to load the model)")
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(
            f"{header.path}: {terminal_safe(key)} = {terminal_safe(repr(value))[:40]} (expected an integer in [{lo}, {hi}])"
        )
    return value


def _per_layer(header: GGUFHeader, key: str, n_layer: int, default: int | None = None) -> tuple[int, ...]:
    """A scalar for every layer or an array of one value per layer (llama_model_loader::get_key_or_arr)."""
    value = header.get(key, default)
    if isinstance(value, list):
        if len(value) != n_layer or any(
            isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_DIM for v in value
        ):
            raise InputError(f"{header.path}: {terminal_safe(key)}: expected {n_layer} integers, one per layer")
        return tuple(value)
    return (_int(header, key, default=default),) * n_layer


def text_model(header: GGUFHeader) -> TextModel:
    arch = header.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InputError(f"{header.path}: general.architecture is missing (not a llama.cpp model file)")
    if arch == "clip":
        raise InputError(
            f"{header.path}: a projector (mmproj) file; give the language model first and this with --mmproj"
        )
    if arch in RECURRENT:
        raise InputError(
            f"{header.path}: architecture {terminal_safe(arch)!r} keeps a recurrent state; not estimated yet"
        )
    if f"{arch}.attention.kv_lora_rank" in header.metadata:
        raise InputError(
            f"{header.path}: architecture {terminal_safe(arch)!r} uses a compressed (MLA) KV cache; not estimated yet"
        )
    p = f"{arch}."
    n_layer = _int(header, p + "block_count", lo=1, hi=MAX_LAYERS)
    n_embd = _int(header, p + "embedding_length", lo=1)
    n_head = _per_layer(header, p + "attention.head_count", n_layer)
    n_head_kv = (
        _per_layer(header, p + "attention.head_count_kv", n_layer, default=None)
        if (p + "attention.head_count_kv" in header.metadata)
        else n_head
    )
    if max(n_head) == 0:
        raise InputError(f"{header.path}: {terminal_safe(arch)}.attention.head_count is 0")
    # llama_model_base::load_hparams: n_embd_head_k defaults to n_embd / n_head (of layer 0)
    head_dim_k = _int(header, p + "attention.key_length", default=n_embd // max(n_head[0], 1))
    head_dim_v = _int(header, p + "attention.value_length", default=n_embd // max(n_head[0], 1))
    n_ff = _per_layer(header, p + "feed_forward_length", n_layer, default=0)
    tokens = header.get("tokenizer.ggml.tokens")
    n_vocab = tokens.length if isinstance(tokens, ArrayInfo) else _int(header, p + "vocab_size", default=0)
    if n_vocab <= 0:
        out = next((t for t in header.tensors if t.name in ("output.weight", "token_embd.weight")), None)
        n_vocab = out.shape[1] if out is not None and len(out.shape) > 1 else 0
    n_swa = _int(header, p + "attention.sliding_window", default=0)
    swa_layers: tuple[bool, ...] = ()
    if n_swa > 0:
        swa_layers = _swa_layers(header, arch, n_layer)
        if not any(swa_layers):
            n_swa = 0
    return TextModel(
        arch=arch,
        n_layer=n_layer,
        n_ctx_train=_int(header, p + "context_length", default=4096, lo=1, hi=1 << 30),
        n_embd=n_embd,
        n_vocab=n_vocab,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_swa=n_swa,
        swa_layers=swa_layers if n_swa else (),
        n_expert=_int(header, p + "expert_count", default=0),
        n_expert_used=_int(header, p + "expert_used_count", default=0),
    )


def _swa_layers(header: GGUFHeader, arch: str, n_layer: int) -> tuple[bool, ...]:
    """llama_model_base::load_swa_pattern: the file's per-layer array, else the period (the file's
    or the architecture's default) expanded by llama_hparams::set_swa_pattern."""
    key = f"{arch}.attention.sliding_window_pattern"
    value: Any = header.get(key)
    if isinstance(value, list):
        if len(value) != n_layer:
            raise InputError(f"{header.path}: {terminal_safe(key)}: expected {n_layer} flags, one per layer")
        return tuple(bool(v) for v in value)
    if arch not in SWA_PERIOD and value is None:
        return ()  # the architecture reads sliding_window but allocates no window cache (qwen2, mistral ...)
    period, dense_first = SWA_PERIOD.get(arch, (0, False))
    if value is not None:
        period = _int(header, key, hi=MAX_LAYERS)
    if dense_first:
        return tuple(period == 0 or il % period != 0 for il in range(n_layer))
    return tuple(period == 0 or il % period < period - 1 for il in range(n_layer))
