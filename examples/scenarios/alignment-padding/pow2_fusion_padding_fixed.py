"""Fixed twin of ``pow2_fusion_padding.py``: pad visual tokens to the batch's longest sequence.

``pad_sequence`` pads every image's visual tokens to the longest one in the batch (300) and
the attention mask hides the padded keys, so the fusion block computes on 300 positions
instead of 512. Nothing is rounded up to a power of two.

Run: ``python pow2_fusion_padding_fixed.py`` or ``memwarden trace pow2_fusion_padding_fixed.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

VISION_DIM, DIM, HEADS = 128, 256, 4
TOKENS_PER_IMAGE = (300, 260, 280, 290)  # dynamic resolution: one image each


class FusionBlock(nn.Module):
    """Projects visual tokens into the language model's width and mixes them with one attention + MLP block."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(VISION_DIM, DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        lengths = torch.tensor([f.shape[0] for f in feats])
        x = pad_sequence(feats, batch_first=True)  # (B, longest, VISION_DIM): padded to 300, no further
        target = x.shape[1]
        keep = torch.arange(target)[None, :] < lengths[:, None]  # (B, T) real tokens
        h = self.proj(x)  # (B, T, DIM)
        b, t, _ = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)  # each (B, H, T, hd)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        h = h + self.out(a.transpose(1, 2).reshape(b, t, DIM))
        return h + self.mlp(h)  # (B, T, DIM)


def main() -> None:
    torch.manual_seed(0)
    block = FusionBlock().eval()
    feats = [torch.randn(n, VISION_DIM) for n in TOKENS_PER_IMAGE]
    with torch.no_grad():
        fused = block(feats)
    print(f"fused visual tokens: {tuple(fused.shape)} for {list(TOKENS_PER_IMAGE)} real tokens")


if __name__ == "__main__":
    main()
