"""M-RoPE positions of a request that continues after a cached prefix (Qwen2-VL, Qwen2.5-VL).

These models rotate queries and keys by 3-D positions (temporal, height, width): text tokens count
1, 2, 3, ... on all three rows, an image's tokens take their place in its grid, and the text after
an image goes on from ``start + max(grid_h, grid_w) / merge`` — not from its token index. The gap
between the two is the model's ``rope_deltas``. ``generate()`` computes the positions of a whole
prompt with ``get_rope_index`` and, when it continues from a cache, adds the ``rope_deltas`` it
stored **on the model** at the last call that saw the images: a session serving several requests
and conversations would continue one sequence with another's delta.

So the session never lets the model guess: for a request served on a cached prefix of ``h`` tokens it
passes ``position_ids`` itself. The cached blocks' positions are fixed by what their hashes cover —
token ids, and the content of every media item up to them (``runtime/media.py`` fingerprints all of
a modality's tensors, ``image_grid_thw`` and ``second_per_grid_ts`` included) — so the position where
the prefix leaves off follows from the request's own items before ``h``: each shifts what follows by
``advance - tokens``, its grid's ``max(h, w) / merge`` less its placeholder count. The positions of
the new tokens continue from there: ``arange + delta`` for text (what ``generate`` does with the
cache passed back), the model's own ``get_rope_index`` over the new part, shifted, when new media
come (what a plain ``generate`` of the whole sequence gives them). vLLM does the same: M-RoPE
positions are a property of the request, computed from its media, sliced where the cache ends.

Only the families whose ``get_rope_index`` follows the rule above are continued; for the other M-RoPE
families (Qwen3-VL's timestamps, GLM-4V, Qwen2.5-Omni's audio interleave) reuse stops before the
first media item, and :func:`reuse_limit_reason` says so.
"""

from __future__ import annotations

from typing import Any

import torch

from memwarden.runtime import media as media_mod
from memwarden.runtime.media import MediaItem

# the grid tensor of each modality whose positions get_rope_index lays out
_GRID_KEYS = {"image": "image_grid_thw", "video": "video_grid_thw"}


def reuse_limit_reason(config: Any, prefix_reuse: bool) -> str | None:
    """Why the session reuses less than the whole cached prefix for this model, or None."""
    if not prefix_reuse:
        return "prefix_reuse=False: every request is prefilled and its media encoded in full"
    model_type = str(getattr(config, "model_type", ""))
    if media_mod.positions_are_media_dependent(config) and not media_mod.positions_continued(config):
        return (
            f"{model_type} places tokens with multimodal rotary positions (M-RoPE) that the session does not "
            "continue after a cached prefix: reuse stops before the first image, video or audio item, which "
            "is encoded and prefilled again every turn"
        )
    return None


class MRopePositions:
    """The ``position_ids`` a Qwen2-VL / Qwen2.5-VL request is served with on a cached prefix."""

    def __init__(self, model: Any) -> None:
        inner = getattr(model, "model", model)  # Qwen2VLForConditionalGeneration.model: Qwen2VLModel
        self.get_rope_index = inner.get_rope_index
        self.merge = int(model.config.vision_config.spatial_merge_size)

    def position_ids(
        self, input_ids: torch.Tensor, inputs: dict[str, Any], items: list[MediaItem], reuse: int
    ) -> torch.Tensor | None:
        """``(4, 1, T)``: row 0 the text positions ``generate`` builds from the attention mask, rows 1-3
        the M-RoPE positions; only ``[..., reuse:]`` is read (generate slices off the cached part).

        ``inputs`` are the whole request's (every item's grid); ``reuse`` never cuts an item. Where
        ``generate`` would use 1-D positions (no ``mm_token_type_ids`` or no grid: the processor's
        output always has both) they are 1-D here too."""
        num_tokens = input_ids.shape[1]
        device = input_ids.device
        text = torch.arange(num_tokens, dtype=torch.long, device=device)  # (T,)
        grids = {m: inputs.get(k) for m, k in _GRID_KEYS.items()}
        types = inputs.get("mm_token_type_ids")
        three_d = isinstance(types, torch.Tensor) and any(isinstance(g, torch.Tensor) for g in grids.values())
        rows = text.view(1, 1, -1).repeat(3, 1, 1)  # (3, 1, T)
        if three_d:
            assert isinstance(types, torch.Tensor)
            start = reuse + self._delta(items, grids, reuse)  # the position the cached prefix leaves off at
            later = [it for it in items if it.start >= reuse and it.modality in _GRID_KEYS]
            if later:  # new media: the model's own rule over the new part, shifted to start there
                kwargs: dict[str, Any] = {}
                for modality, key in _GRID_KEYS.items():
                    mine = [it.index for it in later if it.modality == modality]
                    grid = grids[modality]
                    if mine and isinstance(grid, torch.Tensor):
                        kwargs[key] = grid[mine[0] :]
                seconds = inputs.get("second_per_grid_ts")
                videos = [it.index for it in later if it.modality == "video"]
                if isinstance(seconds, torch.Tensor) and videos:
                    kwargs["second_per_grid_ts"] = seconds[videos[0] :]
                new, _ = self.get_rope_index(input_ids[:, reuse:], mm_token_type_ids=types[:, reuse:], **kwargs)
                rows[:, :, reuse:] = new.to(device) + start  # (3, 1, T - reuse)
            else:  # text only: the careful user's generate() adds the prefix's delta to the text positions
                rows[:, :, reuse:] += start - reuse
        return torch.cat([text.view(1, 1, -1), rows])  # (4, 1, T)

    def _delta(self, items: list[MediaItem], grids: dict[str, Any], stop: int) -> int:
        """Position minus token index after the first ``stop`` tokens: each media item before shifts what
        follows it by its advance (``max(grid_h, grid_w) / merge``, get_rope_index's) less its tokens."""
        delta = 0
        for it in items:
            grid = grids.get(it.modality)
            if it.stop > stop or not isinstance(grid, torch.Tensor):
                continue
            _, grid_h, grid_w = (int(v) for v in grid[it.index].tolist())
            delta += max(grid_h, grid_w) // self.merge - (it.stop - it.start)
        return delta


__all__ = ["MRopePositions", "reuse_limit_reason"]
