"""Caption-Anything-style region captioner: SAM segments 8 boxed regions of a photo, and a small
hand-written transformer decoder (exported from a research repo, no transformers Cache) captions
each region conditioned on the SAM image embedding masked by that region.

The decoder follows the GPT-2 `presents` convention: each step returns new (k, v) per layer built
with torch.cat(past, new) while the caller still holds `past`, so every step allocates the whole
cache again next to the old one.
"""

import math

import torch
import torch.nn.functional as F

import _common as C

EXPECT = "kv-concat-growth"
FIX_WORDS = ["preallocate", "buffer", "in place", "cat", "cache"]

REGIONS = 8
MAX_NEW = 160  # long, dense region descriptions
D, HEADS, LAYERS, VOCAB = 256, 4, 6, 4096

sam = C.sam(image_px=128, patch_px=16, hidden=64, layers=2, out_channels=64)
PREFIX = (128 // 16) ** 2
MAX_LEN = PREFIX + MAX_NEW + 1


def concat_kv(past, new, pos):
    return new if past is None else torch.cat([past, new], dim=2)


def write_kv(past, new, pos):
    if past is None:
        past = new.new_zeros(new.shape[0], new.shape[1], MAX_LEN, new.shape[3])
    past[:, :, pos : pos + new.shape[2]] = new
    return past


kv_update = concat_kv  # MISTAKE


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.out = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D, 2 * D), torch.nn.GELU(), torch.nn.Linear(2 * D, D))

    def forward(self, x, past, pos):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        pk = kv_update(past[0] if past else None, k, pos)
        pv = kv_update(past[1] if past else None, v, pos)
        n = pos + t
        a = F.scaled_dot_product_attention(q, pk[:, :, :n], pv[:, :, :n], is_causal=t > 1)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, D))
        return x + self.mlp(self.ln2(x)), (pk, pv)


class RegionCaptioner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bridge = torch.nn.Linear(64, D)  # SAM embedding channels -> decoder width
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Parameter(torch.randn(MAX_LEN, D) / math.sqrt(D))
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = torch.nn.Linear(D, VOCAB, bias=False)

    def step(self, x, past, pos):
        x = x + self.pos[pos : pos + x.shape[1]]
        presents = []
        for i, blk in enumerate(self.blocks):
            x, kv = blk(x, past[i] if past else None, pos)
            presents.append(kv)
        return self.head(x[:, -1]), presents


torch.manual_seed(0)
captioner = RegionCaptioner().eval()


@torch.no_grad()
def caption_regions(rgb, boxes) -> torch.Tensor:
    x = C.resize(C.normalize(rgb).unsqueeze(0), 128, 128)
    out = sam(pixel_values=x, input_boxes=torch.tensor([boxes], dtype=torch.float), multimask_output=False)
    emb = sam.get_image_embeddings(x)
    emb = emb if torch.is_tensor(emb) else emb[0]  # (1, 64, 8, 8)
    masks = F.interpolate(out.pred_masks[0, :, 0:1].sigmoid(), size=emb.shape[-2:])  # (R, 1, 16, 16)
    prefix = captioner.bridge((emb * (0.5 + masks)).flatten(2).transpose(1, 2))  # (R, 64, D)
    logits, past = captioner.step(prefix, None, 0)
    pos = PREFIX
    tokens = []
    for _ in range(MAX_NEW):
        nxt = logits.argmax(-1, keepdim=True)
        tokens.append(nxt)
        logits, past = captioner.step(captioner.embed(nxt), past, pos)
        pos += 1
    return torch.cat(tokens, 1)


if __name__ == "__main__":
    img = C.fake_rgb(480, 640, seed=3)
    boxes = [[8.0 * i, 4.0 * i, 8.0 * i + 50, 4.0 * i + 60] for i in range(REGIONS)]
    caps = caption_regions(img, boxes)
    print("captions:", tuple(caps.shape))
