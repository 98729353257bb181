"""Fixed twin of kv-concat-growth_caption_decoder: each layer allocates its K/V buffers once, at
prefix + decode length, and writes every new position in place (what transformers' StaticCache does).

Source: https://github.com/huggingface/text-generation-inference/pull/285 — "I guess torch.cat
isn't smart enough for this?"
"""

import torch
from torch import nn

EXPECT = None

D, HEADS, LAYERS, VOCAB = 256, 4, 4, 1024
BATCH, PREFIX, STEPS = 8, 64, 128
MAX_LEN = PREFIX + STEPS


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.k = self.v = None
        self.pos = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        if self.k is None:
            self.k = x.new_empty(b, HEADS, MAX_LEN, D // HEADS)
            self.v = x.new_empty(b, HEADS, MAX_LEN, D // HEADS)
        self.k[:, :, self.pos : self.pos + t] = k
        self.v[:, :, self.pos : self.pos + t] = v
        self.pos += t
        a = nn.functional.scaled_dot_product_attention(
            q, self.k[:, :, : self.pos], self.v[:, :, : self.pos], is_causal=t > 1
        )
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
