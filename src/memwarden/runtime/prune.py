"""Visual-token pruning: step one of the degradation ladder.

A request's image placeholders are the longest part of most VLM prompts (256 of ~300 tokens
for the LLaVA-style zoo models), and prefill memory (KV cache, attention, MLP activations)
and time grow with them. :class:`VisualTokenPruner` keeps the ``keep_ratio`` most important
visual tokens of each image and drops the rest *before* the language model sees them:

1. :meth:`VisualTokenPruner.prune` runs the model's own forward on the full request just far
   enough to score every visual token, picks the tokens to keep (in their original order), and
   returns a :class:`PrunedRequest` whose ``input_ids``/``attention_mask``/``token_type_ids``/...
   have the dropped placeholders removed.
2. :meth:`VisualTokenPruner.applied` wraps ``model.model.get_image_features`` *on the instance*
   for the length of one ``generate()`` call, so that the model's image-feature path returns only
   the kept rows. The model's own ``generate()`` then runs unchanged on the shorter sequence.

The encoder runs once: features computed while scoring are handed to the generate call.

Methods (``importance`` of a visual token, highest kept):

- ``"summary"``: cosine similarity of the token's projected feature to the mean feature of its
  image (the image's summary), i.e. keep the most representative tokens.
- ``"diverse"``: the opposite order, keep the tokens *least* like the summary (the outliers).
- ``"fastv"``: attention the text tokens after the image pay to it at language-model layer
  ``fastv_layer`` (FastV, Chen et al. 2024, K=2). Layers ``0..K-1`` run on the full prefill with
  no KV cache; the attention probabilities of layer K are computed from that layer's own
  q/k projections, norms and rotary embedding for the text queries only (``(heads, queries, T)``,
  never the ``(heads, T, T)`` matrix eager attention would make).
- ``"random"``: a seeded random choice, the baseline the others must beat.

Unlike FastV proper, which drops tokens inside the LM after layer K and keeps their positions,
the pruned request is a shorter prompt from layer 0 on (as in PruMerge/VisionZip): positions
are contiguous, every layer's KV cache shrinks, and the plain ``generate()`` serves it.

Supported: the families that merge image features with a ``masked_scatter`` over placeholder
tokens and use 1-D positions: LLaVA, PaliGemma, Gemma 3, Idefics3. Qwen2-VL / Qwen2.5-VL are
refused with :class:`PruningUnsupportedError`: their M-RoPE positions are computed from the image
grid (``image_grid_thw``) over the placeholder run, so a shortened run no longer matches the grid.
Audio models are refused too (their placeholders come from ``get_audio_features``).

``keep_ratio=1.0`` returns the request unchanged and installs nothing, so the output equals the
unpruned ``generate()`` exactly.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F

from memwarden.errors import InputError, MemwardenError

__all__ = [
    "METHODS",
    "PrunedRequest",
    "PruningUnsupportedError",
    "VisualTokenPruner",
    "kept_count",
    "unsupported_reason",
]

Method = Literal["summary", "diverse", "fastv", "random"]
METHODS: tuple[str, ...] = ("summary", "diverse", "fastv", "random")

# Families whose image tokens can be dropped, and why the others cannot.
_SUPPORTED = ("llava", "paligemma", "gemma3", "idefics3")
_UNSUPPORTED = {
    "qwen2_vl": "its M-RoPE positions are computed from image_grid_thw over the whole placeholder run; "
    "a shortened run no longer matches the (t, h, w) grid",
    "qwen2_5_vl": "its M-RoPE positions are computed from image_grid_thw over the whole placeholder run; "
    "a shortened run no longer matches the (t, h, w) grid",
    "qwen2_audio": "it is an audio model; audio placeholders come from get_audio_features, which the pruner "
    "does not wrap",
}
# Per-token tensors of a request: shortened together with input_ids. Everything else (pixels,
# grids, masks over pixels) is per image and left alone.
_PER_TOKEN = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids", "position_ids")


class PruningUnsupportedError(MemwardenError):
    """The model's architecture cannot take a request with fewer visual tokens than its images make."""


class _Stop(Exception):
    """Raised inside the model's forward once the FastV scorer has what it needs."""


def kept_count(num_tokens: int, keep_ratio: float) -> int:
    """Visual tokens kept of an image's ``num_tokens``: ``round(keep_ratio * n)``, at least one."""
    return max(1, min(num_tokens, round(keep_ratio * num_tokens)))


def _check_ratio(keep_ratio: Any) -> float:
    if isinstance(keep_ratio, bool) or not isinstance(keep_ratio, (int, float)):
        raise InputError(f"keep_ratio must be a number in (0, 1]; got {keep_ratio!r}")
    ratio = float(keep_ratio)
    if not (0.0 < ratio <= 1.0):  # also rejects NaN
        raise InputError(
            f"keep_ratio must be in (0, 1] (the fraction of visual tokens kept; 1.0 keeps all); got {keep_ratio!r}"
        )
    return ratio


@dataclass(frozen=True, kw_only=True)
class PrunedRequest:
    """A request with fewer visual tokens, and which ones survived.

    ``inputs``: what to pass to ``model.generate(**inputs)`` inside ``pruner.applied(request)``.
    ``kept``: per feature chunk (one image, or one batch row's images for Idefics3), the indices of
    the kept visual tokens within the chunk, ascending.
    ``removed_tokens``: placeholder tokens dropped from each row of ``input_ids``.
    """

    inputs: dict[str, Any]
    keep_ratio: float
    method: str
    kept: tuple[torch.Tensor, ...]  # each (k_i,) long, ascending
    num_visual_tokens: int  # placeholders per row before pruning
    removed_tokens: int  # placeholders removed per row
    scores: tuple[torch.Tensor, ...] = field(default=(), repr=False)  # each (n_i,) importance, float32
    # Features of the kept tokens, computed while scoring, served to the generate call instead of
    # encoding the image again, to a call with the same pixel tensor (same memory and layout).
    _features: Any = field(default=None, repr=False, compare=False)
    _pixels: Any = field(default=None, repr=False, compare=False)

    @property
    def is_identity(self) -> bool:
        return self.removed_tokens == 0


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why ``model``'s requests cannot be pruned, or None when they can (for the degradation ladder
    to skip this step without trying it)."""
    family = getattr(getattr(model, "config", None), "model_type", None)
    if family in _UNSUPPORTED:
        return f"visual-token pruning does not support {family}: {_UNSUPPORTED[family]}"
    inner = getattr(model, "model", None)
    if family not in _SUPPORTED or not callable(getattr(inner, "get_image_features", None)):
        return f"visual-token pruning does not support model type {family!r}; supported: {', '.join(_SUPPORTED)}"
    return None


class VisualTokenPruner:
    """Prunes the visual tokens of requests to one transformers VLM (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, *, fastv_layer: int = 2, seed: int = 0) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise PruningUnsupportedError(reason)
        family = str(getattr(model.config, "model_type", ""))
        inner: Any = model.model  # the transformers *Model under *ForConditionalGeneration
        if fastv_layer < 0:
            raise InputError(f"fastv_layer must be >= 0; got {fastv_layer}")
        self.model = model
        self.inner = inner
        self.family = family
        cfg: Any = model.config
        self.image_token_id = int(getattr(cfg, "image_token_id", None) or cfg.image_token_index)
        self.language_model: Any = getattr(inner, "language_model", None) or inner.text_model
        n_layers = len(self.language_model.layers)
        # A model shallower than K scores at its last layer.
        self.fastv_layer = min(fastv_layer, n_layers - 1)
        self.seed = seed

    # -- public ------------------------------------------------------------------------------
    def prune(self, inputs: dict[str, Any], keep_ratio: float, method: str = "summary") -> PrunedRequest:
        """Score the visual tokens of ``inputs`` and drop all but ``keep_ratio`` of each image's."""
        ratio = _check_ratio(keep_ratio)
        if method not in METHODS:
            raise InputError(f"unknown pruning method {method!r}; valid: {', '.join(METHODS)}")
        input_ids = inputs.get("input_ids")
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise InputError("visual-token pruning needs input_ids of shape (batch, tokens)")
        is_visual = input_ids == self.image_token_id  # (B, T)
        per_row = is_visual.sum(dim=1)
        if int(per_row.min()) != int(per_row.max()):
            raise InputError(
                "visual-token pruning needs the same number of image tokens in every row; prune rows separately"
            )
        n_visual = int(per_row[0])
        if n_visual == 0 or ratio == 1.0:
            return PrunedRequest(
                inputs=dict(inputs),
                keep_ratio=ratio,
                method=method,
                kept=(),
                num_visual_tokens=n_visual,
                removed_tokens=0,
            )

        features, scores = self._score(inputs, method, is_visual)
        kept = tuple(torch.sort(torch.topk(s, kept_count(len(s), ratio)).indices).values for s in scores)
        drop = _drop_mask(is_visual, [len(s) for s in scores], kept)  # (B, T) True where a placeholder goes
        dropped_per_row = drop.sum(dim=1)
        if int(dropped_per_row.min()) != int(dropped_per_row.max()):
            raise InputError("pruning would leave rows of different lengths (images spread unevenly over rows)")
        keep_pos = ~drop
        new_inputs = dict(inputs)
        for name in _PER_TOKEN:
            t = inputs.get(name)
            if isinstance(t, torch.Tensor) and t.shape[:2] == input_ids.shape:
                new_inputs[name] = t[keep_pos].view(input_ids.shape[0], -1, *t.shape[2:])
        return PrunedRequest(
            inputs=new_inputs,
            keep_ratio=ratio,
            method=method,
            kept=kept,
            num_visual_tokens=n_visual,
            removed_tokens=int(dropped_per_row[0]),
            scores=scores,
            _features=self._select(features, kept),
            _pixels=inputs.get("pixel_values"),
        )

    @contextlib.contextmanager
    def applied(self, request: PrunedRequest) -> Iterator[None]:
        """Within the block, the model's image-feature path returns only ``request``'s kept tokens.

        Wraps ``model.model.get_image_features`` on the instance; a call with the request's own pixel
        tensor gets the features computed while scoring (no second encode), any other call is encoded
        and then selected. Not re-entrant; one request at a time per model.
        """
        if request.is_identity:
            yield
            return
        original = self.inner.get_image_features

        # functools.wraps keeps the signature: generate() reads it to route pixel_values here.
        @functools.wraps(original)
        def get_image_features(*args: Any, **kwargs: Any) -> Any:
            pixels = args[0] if args else kwargs.get("pixel_values")
            if request._features is not None and _same_tensor(pixels, request._pixels):
                return request._features
            return self._select(original(*args, **kwargs), request.kept)

        with _installed(self.inner, get_image_features):
            yield

    # -- scoring -----------------------------------------------------------------------------
    def _score(
        self, inputs: dict[str, Any], method: str, is_visual: torch.Tensor
    ) -> tuple[Any, tuple[torch.Tensor, ...]]:
        """(image-feature output of the full request, importance per visual token of each chunk)."""
        original = self.inner.get_image_features
        seen: dict[str, Any] = {}
        if method != "fastv":
            # Only the features are needed: call the encoder path the way generate() does, with the
            # request's tensors that its signature names.
            params = inspect.signature(original).parameters
            media = {k: v for k, v in inputs.items() if k in params and k != "kwargs"}
            media["return_dict"] = True
            with torch.no_grad():
                seen["features"] = _slim(original(**media))
        else:
            self._run_to_layer(inputs, seen)

        chunks = _chunks(_pooled(seen["features"]))
        if method in ("summary", "diverse"):
            sims = tuple(F.cosine_similarity(c.float(), c.float().mean(0, keepdim=True), dim=-1) for c in chunks)
            return seen["features"], sims if method == "summary" else tuple(-s for s in sims)
        if method == "random":
            gen = torch.Generator().manual_seed(self.seed)
            return seen["features"], tuple(torch.rand(len(c), generator=gen) for c in chunks)
        attn = self.language_model.layers[self.fastv_layer].self_attn
        received = self._text_attention(attn, seen["hidden"], seen["rope"], is_visual)  # (B, T)
        flat = received[is_visual]  # row-major, the order masked_scatter fills placeholders in
        return seen["features"], tuple(flat.split([len(c) for c in chunks]))

    def _run_to_layer(self, inputs: dict[str, Any], seen: dict[str, Any]) -> None:
        """Run the model's forward on the full request (no KV cache) until the attention of layer
        ``fastv_layer``; note the image features and that attention's input and rotary embedding."""
        original = self.inner.get_image_features

        @functools.wraps(original)
        def stash(*args: Any, **kwargs: Any) -> Any:
            # The slim copy lets the vision tower's hidden states go before the language model runs.
            seen["features"] = out = _slim(original(*args, **kwargs))
            return out

        def stop_at_attention(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen["hidden"] = args[0] if args else kwargs["hidden_states"]  # (B, T, D), after the input norm
            seen["rope"] = kwargs.get("position_embeddings")  # (cos, sin), each (B, T, head_dim)
            raise _Stop

        attn = self.language_model.layers[self.fastv_layer].self_attn
        handle = attn.register_forward_pre_hook(stop_at_attention, with_kwargs=True)
        try:
            with _installed(self.inner, stash), torch.no_grad():
                self.inner(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False)
        except _Stop:
            pass
        finally:
            handle.remove()
        if "features" not in seen or "hidden" not in seen:
            raise PruningUnsupportedError(
                f"{self.family}: the forward pass did not reach the image features and layer {self.fastv_layer}"
            )

    def _text_attention(self, attn: Any, hidden: torch.Tensor, rope: Any, is_visual: torch.Tensor) -> torch.Tensor:
        """Attention each token receives from the text tokens after the last image, per row, at this layer:
        softmax(q k^T * scaling) under the causal mask, averaged over heads and queries. (B, T) float32."""
        if rope is None:
            raise PruningUnsupportedError(f"{self.family}: layer attention received no rotary position embeddings")
        apply_rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        cos, sin = rope  # (B, T, head_dim)
        head_dim = int(attn.head_dim)
        batch, length, _ = hidden.shape
        positions = torch.arange(length, device=hidden.device)
        out = torch.zeros(batch, length, dtype=torch.float32)
        with torch.no_grad():
            for b in range(batch):
                last_visual = int(positions[is_visual[b]].max())
                q_pos = positions[last_visual + 1 :]
                if len(q_pos) == 0:
                    q_pos = positions[-1:]
                h = hidden[b : b + 1]
                q = attn.q_proj(h[:, q_pos]).view(1, len(q_pos), -1, head_dim).transpose(1, 2)  # (1, H, m, hd)
                k = attn.k_proj(h).view(1, length, -1, head_dim).transpose(1, 2)  # (1, Hkv, T, hd)
                if hasattr(attn, "q_norm"):
                    q, k = attn.q_norm(q), attn.k_norm(k)
                q = apply_rope(q, q, cos[b : b + 1, q_pos], sin[b : b + 1, q_pos])[0]
                k = apply_rope(k, k, cos[b : b + 1], sin[b : b + 1])[0]
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # GQA: (1, H, T, hd)
                logits = (q.float() @ k.float().transpose(-1, -2)) * float(attn.scaling)  # (1, H, m, T)
                logits = logits.masked_fill(positions[None, :] > q_pos[:, None], float("-inf"))
                out[b] = logits.softmax(-1).mean(dim=(0, 1, 2))
        return out

    # -- selection ---------------------------------------------------------------------------
    def _select(self, output: Any, kept: tuple[torch.Tensor, ...]) -> Any:
        """A copy of a get_image_features output whose pooled features hold only the kept rows."""
        pooled = _pooled(output)
        chunks = _chunks(pooled)
        if len(chunks) != len(kept) or any(len(c) < len(k) for c, k in zip(chunks, kept, strict=True)):
            raise InputError("the image features do not match the pruned request (a different image?)")
        picked = [c.index_select(0, k.to(c.device)) for c, k in zip(chunks, kept, strict=True)]
        if isinstance(pooled, torch.Tensor) and pooled.dim() == 3 and len({len(k) for k in kept}) == 1:
            selected: Any = torch.stack(picked)  # (images, k, D), the layout the model expects
        else:
            selected = picked
        # A fresh output object without the vision tower's hidden states, which would otherwise stay
        # alive until generate() returns.
        return type(output)(pooler_output=selected) if hasattr(output, "pooler_output") else selected


@contextlib.contextmanager
def _installed(inner: Any, get_image_features: Any) -> Iterator[None]:
    """``inner.get_image_features`` replaced on the instance for the block; whatever the instance had
    before (the class's method, or another wrapper, e.g. a caller's) is back afterwards."""
    before = vars(inner).get("get_image_features")
    inner.get_image_features = get_image_features
    try:
        yield
    finally:
        if before is None:
            vars(inner).pop("get_image_features", None)
        else:
            inner.get_image_features = before


def _slim(output: Any) -> Any:
    """The output with only ``pooler_output``: all the model reads of it."""
    return type(output)(pooler_output=output.pooler_output) if hasattr(output, "pooler_output") else output


def _pooled(output: Any) -> Any:
    return output.pooler_output if hasattr(output, "pooler_output") else output


def _chunks(pooled: Any) -> list[torch.Tensor]:
    """Per image (or per row, Idefics3) feature matrices (n_i, D) in placeholder order."""
    if isinstance(pooled, torch.Tensor):
        return list(pooled) if pooled.dim() == 3 else [pooled]
    return [c.reshape(-1, c.shape[-1]) for c in pooled]


def _drop_mask(is_visual: torch.Tensor, sizes: list[int], kept: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """(B, T) True on the placeholders of dropped tokens; chunks fill placeholders row-major."""
    keep_flat = torch.cat(
        [torch.zeros(n, dtype=torch.bool).index_fill_(0, k, True) for n, k in zip(sizes, kept, strict=True)]
    )
    drop = torch.zeros_like(is_visual)
    drop[is_visual] = ~keep_flat
    return drop


def _same_tensor(a: Any, b: Any) -> bool:
    """Same data: the same tensor, or a view of the same memory with the same layout."""
    if a is b:
        return a is not None
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False

    def layout(t: torch.Tensor) -> tuple[Any, ...]:
        return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)

    return layout(a) == layout(b)
