"""A hand-written streaming caption decoder (visual prefix tokens from a small patch encoder, then
greedy decoding of 8 captions in parallel) that keeps its own key/value cache and grows it with
``torch.cat`` at every decode step.

Source: https://github.com/huggingface/text-generation-inference/pull/285 (review thread on
concatenating ``past_key_values``): "I guess torch.cat isn't smart enough for this?" — "Well this is
what torch.cat is doing at batch size 256. Kinda scary."
See also https://github.com/pytorch/pytorch/issues/49791 (caching for autoregressive decoding).

Every step allocates a new K and V tensor one position longer in every layer and copies the old
one into it: the old and new cache coexist at each step, and the allocator sees a growing series
of differently-sized blocks. A buffer allocated once at the final length avoids both.
"""

import torch
from torch import nn

EXPECT = "kv-concat-growth"
FIX_WORDS = ("preallocat", "static", "StaticCache", "buffer", "in place", "index_copy")

D, HEADS, LAYERS, VOCAB = 256, 4, 4, 1024
BATCH, PREFIX, STEPS = 8, 64, 128


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.k = self.v = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=2)  # MISTAKE
            self.v = torch.cat([self.v, v], dim=2)
        a = nn.functional.scaled_dot_product_attention(q, self.k, self.v, is_causal=t > 1)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, D))
        return x + self.mlp(x)


class CaptionDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, D, kernel_size=28, stride=28)
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(D, VOCAB)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x[:, -1])


def main() -> None:
    torch.manual_seed(0)
    model = CaptionDecoder().eval()
    images = torch.randn(BATCH, 3, 224, 224)
    with torch.no_grad():
        prefix = model.patch(images).flatten(2).transpose(1, 2)  # (B, 64, D) visual tokens
        token = model.step(prefix).argmax(-1)
        tokens = [token]
        for _ in range(STEPS - 1):
            token = model.step(model.embed(token)[:, None]).argmax(-1)
            tokens.append(token)
    print("captions:", torch.stack(tokens, 1)[:, :8].tolist())


if __name__ == "__main__":
    main()
