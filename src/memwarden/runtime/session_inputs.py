"""A GovernedSession request's inputs, checked and split into rows the way ``generate()`` reads them.

The session serves a batch one row at a time, so each row must get exactly its own media: a row's
images are the next ones in order, as many as the row has placeholder runs (transformers' processors
put one image after another, row by row). Where that cannot be told — fewer images than the rows'
placeholders, tensors that are not one row per item — the request is refused as plain
``model.generate()`` refuses it, never served with another row's picture. A row whose attention mask
keeps no token has nothing to generate from and is refused too.
"""

from __future__ import annotations

from typing import Any

import torch

from memwarden.runtime import media as media_mod

PER_TOKEN_KEYS = ("attention_mask", "token_type_ids", "mm_token_type_ids")


def check_request(input_ids: Any, max_new_tokens: Any) -> None:
    """``input_ids`` a (batch, tokens) integer tensor with tokens, ``max_new_tokens`` a count."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a tensor of token ids, not {type(input_ids).__name__}")
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be (batch, tokens) with at least one token, not {tuple(input_ids.shape)}")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, not {input_ids.dtype}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int, not {max_new_tokens!r}")


def split_rows(
    config: Any, input_ids: torch.Tensor, inputs: dict[str, Any]
) -> list[tuple[torch.Tensor, dict[str, Any]]]:
    """(ids (1, T'), inputs) of each row: padding the mask drops removed, the row's own media only.
    Raises ValueError where a row's mask keeps nothing or the media cannot be assigned to rows."""
    rows_n = int(input_ids.shape[0])
    media_rows = _media_by_row(config, input_ids, inputs)
    rows = []
    for r in range(rows_n):
        row: dict[str, Any] = {}
        for k, v in inputs.items():
            if k in PER_TOKEN_KEYS and isinstance(v, torch.Tensor):
                if v.dim() != 2 or v.shape[0] != rows_n or v.shape[1] != input_ids.shape[1]:
                    raise ValueError(
                        f"{k} has shape {tuple(v.shape)}, input_ids {tuple(input_ids.shape)}: they must match"
                    )
                row[k] = v[r : r + 1]
            elif k in media_rows:
                mine = media_rows[k][r]
                if mine is not None:  # a row without this modality's placeholders gets none of its tensors
                    row[k] = mine
            elif isinstance(v, torch.Tensor) and rows_n > 1 and v.dim() >= 1 and v.shape[0] == rows_n:
                row[k] = v[r : r + 1]
            else:
                row[k] = v
        mask = row.get("attention_mask")
        keep = mask[0].bool() if isinstance(mask, torch.Tensor) else torch.ones(input_ids.shape[1], dtype=torch.bool)
        if not bool(keep.any()):
            raise ValueError(f"row {r} of the attention mask is all zeros: there is no token to generate from")
        row = {k: (v[:, keep] if k in PER_TOKEN_KEYS and isinstance(v, torch.Tensor) else v) for k, v in row.items()}
        rows.append((input_ids[r : r + 1, keep], row))
    return rows


def _media_by_row(config: Any, input_ids: torch.Tensor, inputs: dict[str, Any]) -> dict[str, list[torch.Tensor | None]]:
    """Per media tensor key, its slice for each row (only for a batch of several rows)."""
    rows_n = int(input_ids.shape[0])
    if rows_n == 1:
        return {}
    out: dict[str, list[torch.Tensor | None]] = {}
    placeholders = media_mod.placeholder_ids(config)
    for modality in media_mod.MEDIA_KEYS:
        tensors = media_mod.media_tensors(inputs, modality)
        token = placeholders.get(modality)
        counts = [
            len(media_mod.placeholder_runs(input_ids[r].tolist(), token)) if token is not None else 0
            for r in range(rows_n)
        ]
        total = sum(counts)
        if not tensors:
            if total:
                raise ValueError(f"the batch has {total} {modality} placeholders and no {modality} inputs")
            continue
        if not media_mod.splittable(inputs, modality, total) or total == 0:
            shapes = ", ".join(f"{k} {tuple(t.shape)}" for k, t in tensors.items())
            raise ValueError(
                f"cannot tell which {modality} belongs to which row: the {rows_n} rows have {counts} {modality} "
                f"placeholders ({total} in all) but the inputs are {shapes}; give one {modality} per placeholder, "
                "or send the rows one at a time"
            )
        starts = [sum(counts[:r]) for r in range(rows_n)]
        for key, t in tensors.items():
            out[key] = [t[starts[r] : starts[r] + counts[r]] if counts[r] else None for r in range(rows_n)]
    return out


__all__ = ["PER_TOKEN_KEYS", "check_request", "join_rows", "split_rows"]


def join_rows(rows: list[torch.Tensor], pad: int) -> torch.Tensor:
    """The rows served one by one as one batch, as ``generate`` returns it: left-padded to the
    longest with ``pad``."""
    if len(rows) == 1:
        return rows[0]
    width = max(r.shape[1] for r in rows)
    return torch.cat([torch.nn.functional.pad(r, (width - r.shape[1], 0), value=pad) for r in rows])
