import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""A GPT-SoVITS-style text-to-semantic (T2S) stage for voice cloning: the reference clip is turned
into semantic tokens by a HuBERT-style encoder, then a hand-written autoregressive transformer
predicts the semantic tokens of the target sentences (a batch of 8 lines). `decode_next_token` grows
every layer's K/V with torch.cat at each of the 560 decode steps and returns new cache lists while
the caller still holds the old ones."""

import torch
from torch import nn

EXPECT = "kv-concat-growth"
FIX_WORDS = ("preallocate", "static", "in place", "copy_", "narrow")


class T2SBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)

    def attend(self, x, k, v, causal):
        b, t, d = x.shape
        q = self.qkv(x).chunk(3, dim=-1)[0]
        q = q.view(b, t, self.heads, -1).transpose(1, 2)
        kh = k.view(b, k.shape[1], self.heads, -1).transpose(1, 2)
        vh = v.view(b, v.shape[1], self.heads, -1).transpose(1, 2)
        a = nn.functional.scaled_dot_product_attention(q, kh, vh, is_causal=causal)
        x = self.norm1(x + self.out(a.transpose(1, 2).reshape(b, t, d)))
        return self.norm2(x + self.mlp(x))

    def new_kv(self, x):
        _, k, v = self.qkv(x).chunk(3, dim=-1)
        return k, v


class T2SModel(nn.Module):
    def __init__(self, vocab=1025, d=128, heads=4, layers=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(T2SBlock(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def process_prompt(self, x):
        k_cache, v_cache = [], []
        for blk in self.blocks:
            k, v = blk.new_kv(x)
            k_cache.append(k)
            v_cache.append(v)
            x = blk.attend(x, k, v, causal=True)
        return x, k_cache, v_cache

    def decode_next_token(self, x, k_cache, v_cache):
        new_k, new_v = [], []
        for i, blk in enumerate(self.blocks):
            k, v = blk.new_kv(x)
            k = torch.cat([k_cache[i], k], dim=1)  # MISTAKE
            v = torch.cat([v_cache[i], v], dim=1)
            new_k.append(k)
            new_v.append(v)
            x = blk.attend(x, k, v, causal=False)
        return x, new_k, new_v


def semantic_prompt(ref_wave, batch):
    """cnhubert-style: encoder features of the reference clip -> nearest of 1024 codebook entries."""
    hubert = C.wav2vec2_classifier(hidden=128, layers=2, kind="hubert").hubert
    with torch.no_grad():
        feats = hubert(torch.from_numpy(ref_wave).unsqueeze(0)).last_hidden_state[0]
        codebook = torch.randn(1024, feats.shape[-1], generator=torch.Generator().manual_seed(3))
        codes = torch.cdist(feats, codebook).argmin(-1)
    return codes.unsqueeze(0).expand(batch, -1)


@torch.no_grad()
def infer_semantic(model, phones, prompt_codes, max_new=560):
    x = model.emb(torch.cat([phones, prompt_codes], dim=1))
    h, k_cache, v_cache = model.process_prompt(x)
    tokens = []
    nxt = model.head(h[:, -1]).argmax(-1)
    for _ in range(max_new):
        tokens.append(nxt)
        h, k_cache, v_cache = model.decode_next_token(model.emb(nxt)[:, None], k_cache, v_cache)
        nxt = model.head(h[:, -1]).argmax(-1)
    return torch.stack(tokens, 1)


def main():
    torch.manual_seed(0)
    ref = C.fake_speech(2.0, seed=2)
    lines = 8
    prompt_codes = semantic_prompt(ref, lines)
    model = T2SModel().eval()
    phones = torch.randint(3, 1000, (lines, 32), generator=torch.Generator().manual_seed(1))
    sem = infer_semantic(model, phones, prompt_codes)
    print("semantic tokens:", tuple(sem.shape))


if __name__ == "__main__":
    main()
