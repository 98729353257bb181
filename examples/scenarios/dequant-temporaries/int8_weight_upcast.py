"""Weight-only int8 model whose linear layers upcast the whole weight per call.

What is wrong: a small VLM (patch encoder, projector, language model) is
deployed W8A16: int8 weights with one scale per output channel, bf16
activations, to halve its memory. The hand-written ``W8Linear`` computes
``F.linear(x, self.weight.to(x.dtype) * self.scale[:, None])``: every call
makes a bf16 copy of the whole weight (2x the int8 bytes) and a second one
for the scaled result -- in the image encoder, the projector and the language
model, for every request. The peak is the int8 weights plus two bf16 copies
of the largest layer: the int8 checkpoint saves nothing at the peak.

The fix (``int8_weight_upcast_fixed.py``): call PyTorch's fused weight-only
int8 matmul, ``torch._weight_int8pack_mm(x, weight, scale)``, which reads the
int8 weight directly; nothing weight-sized is allocated per call.

Run: ``python int8_weight_upcast.py`` or ``memwarden trace int8_weight_upcast.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PATCH_DIM, VISION, DIM, FFN, VOCAB = 768, 512, 1024, 4096, 1024
PATCHES, PROMPT, REQUESTS = 64, 16, 4
DTYPE = torch.bfloat16  # W8A16: int8 weights, bf16 activations


class W8Linear(nn.Module):
    """int8 weight (out, in) with a bf16 scale per output channel."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        # A pre-quantised checkpoint (random here).
        q = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8)
        self.weight = nn.Parameter(q, requires_grad=False)
        self.scale = nn.Parameter(torch.rand(out_features, dtype=DTYPE) / 256, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype) * self.scale[:, None])  # bf16 copy of the whole weight


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = W8Linear(dim, hidden), W8Linear(hidden, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(F.gelu(self.up(h)))


class W8Vlm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.vision_tower = nn.Sequential(W8Linear(PATCH_DIM, VISION), Mlp(VISION, 4 * VISION))
        self.multi_modal_projector = W8Linear(VISION, DIM)
        self.embed_tokens = nn.Embedding(VOCAB, DIM, dtype=DTYPE)
        self.language_model = nn.ModuleList([Mlp(DIM, FFN), Mlp(DIM, FFN)])
        self.lm_head = W8Linear(DIM, VOCAB)

    def forward(self, patches: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        image = self.multi_modal_projector(self.vision_tower(patches))  # (B, P, DIM)
        h = torch.cat([image, self.embed_tokens(ids)], dim=1)  # (B, P+T, DIM)
        for layer in self.language_model:
            h = layer(h + h.mean(dim=1, keepdim=True))  # cheap token mixing: every token sees the image
        return self.lm_head(h[:, -1])  # (B, VOCAB) next-token logits


def main() -> None:
    torch.manual_seed(0)
    model = W8Vlm().eval()
    answers = []
    with torch.inference_mode():
        for _ in range(REQUESTS):  # one image and question per request
            patches = torch.randn(1, PATCHES, PATCH_DIM, dtype=DTYPE)  # (B, P, patch_dim), normalised
            ids = torch.randint(0, VOCAB, (1, PROMPT))
            answers.append(int(model(patches, ids).argmax(-1)))
    print("first answer tokens", answers)


if __name__ == "__main__":
    main()
