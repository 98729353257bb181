"""Fixed twin of ``projector_max_tokens.py``: the projector returns the image's own tokens.

No fixed 576-token slot: the projected features of a 144-token image stay 144 tokens, so the
language model runs on 144 + 32 positions and needs no mask for the image part. A batch of
images of different sizes would pad to the batch's longest (or pack), never to a fixed maximum.

Run: ``python projector_max_tokens_fixed.py`` or ``memwarden trace projector_max_tokens_fixed.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VISION_DIM, DIM, HEADS, LAYERS, VOCAB = 192, 256, 4, 2, 2048
IMAGE_TOKENS = 144  # what this image actually has
TEXT_TOKENS, BATCH = 32, 2


class Projector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(VISION_DIM, DIM), nn.GELU(), nn.Linear(DIM, DIM))

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.mlp(feats)  # (B, n, DIM): the image's own tokens, no slot to fill
        keep = torch.ones(x.shape[:2], dtype=torch.bool)  # (B, n)
        return x, keep


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)  # (B, H, T, hd)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        h = h + self.out(a.transpose(1, 2).reshape(b, t, DIM))
        return h + self.mlp(self.norm2(h))


class TinyVLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.projector = Projector()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, image_feats: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        img, img_keep = self.projector(image_feats)  # (B, slot, DIM), (B, slot)
        h = torch.cat([img, self.embed(input_ids)], dim=1)  # (B, slot + text, DIM)
        keep = torch.cat([img_keep, torch.ones_like(input_ids, dtype=torch.bool)], dim=1)
        for layer in self.layers:
            h = layer(h, keep)
        return self.lm_head(h[:, -1])  # (B, VOCAB): next-token logits


def main() -> None:
    torch.manual_seed(0)
    model = TinyVLM().eval()
    image_feats = torch.randn(BATCH, IMAGE_TOKENS, VISION_DIM)  # from the vision encoder
    input_ids = torch.randint(3, VOCAB, (BATCH, TEXT_TOKENS))
    with torch.no_grad():
        logits = model(image_feats, input_ids)
    print(f"next tokens: {logits.argmax(-1).tolist()}")


if __name__ == "__main__":
    main()
