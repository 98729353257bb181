"""Stage 3: the category of every block from its lifetime, before any tag.

A block made inside a module call is a temporary if it was freed before that call returned, an
activation if it outlived it; a block made outside any module is ``other``, or a temporary when
the autograd engine made it (backward runs outside module calls). Tags (parameters, KV cache,
inputs) override these later.
"""

from __future__ import annotations

import numpy as np

from memwarden.record.attribution.recorded import Blocks
from memwarden.trace.model import Category

__all__ = ["block_categories"]


def block_categories(
    blocks: Blocks, own_span: np.ndarray, span_end_ns: np.ndarray, is_backward: np.ndarray
) -> np.ndarray:
    """int64 Category per block. ``own_span``: the innermost call open when each block was made
    (-1 = none); ``span_end_ns``: each call's end, with the capture's end at index -1."""
    made_in_module = own_span >= 0
    temporary = made_in_module & (blocks.free_ns <= span_end_ns[own_span])
    category = np.where(
        made_in_module, np.where(temporary, int(Category.TEMPORARY), int(Category.ACTIVATION)), int(Category.OTHER)
    )
    return np.where(is_backward & ~made_in_module, int(Category.TEMPORARY), category)
