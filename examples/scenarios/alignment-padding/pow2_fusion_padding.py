"""Visual tokens padded to the next power of two before a fusion transformer block.

What is wrong: a dynamic-resolution vision encoder gives each image a different
number of visual tokens (260-300 here). The fusion block that mixes them
collates the batch with ``pad_sequence`` and then rounds the length up to the
next power of two (512) "so the attention kernel gets aligned shapes". Every
activation of the fusion block -- the projected tokens, Q/K/V, the attention
weights (quadratic in the length), the 4x-wide MLP -- is computed for 512
positions of which 300 at most carry data: about 45% of the block's memory is
padding.

The fix (``pow2_fusion_padding_fixed.py``): pad to the batch's longest sequence
(``pad_sequence`` alone) and mask the padded keys. Outputs for the real tokens
are the same; the padded length drops from 512 to 300.

Run: ``python pow2_fusion_padding.py`` or ``memwarden trace pow2_fusion_padding.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

VISION_DIM, DIM, HEADS = 128, 256, 4
TOKENS_PER_IMAGE = (300, 260, 280, 290)  # dynamic resolution: one image each


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


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
        x = pad_sequence(feats, batch_first=True)  # (B, longest, VISION_DIM)
        target = next_power_of_two(x.shape[1])  # the mistake: 300 -> 512
        x = F.pad(x, (0, 0, 0, target - x.shape[1]))  # (B, 512, VISION_DIM)
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
