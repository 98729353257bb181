"""A hand-written captioning decoder on SmolVLM/Idefics3 image features that grows its KV cache by cat.

FIXED TWIN: the cache is allocated once for prefix + caption and written in place at each position (step_static).

What the user did: ported SmolVLM inference to a small hand-written runtime. The attention cache is
appended with ``cat([k_cache, k])`` on every decoding step, which "reallocates and copies the entire
cache on every decoding step"; the proposal is a preallocated cache written at an offset. In
transformers, the tuple-based cache had the same shape of problem: "Since torch.cat() creates a copy,
and ... the old cache is referenced in the inputs so cannot be garbage collected, the current
implementation basically has 2 copies of the full cache in every iteration."

Sources:
- https://github.com/kornia/kornia-rs/issues/903 ("Optimize autoregressive KV cache updates to avoid
  repeated tensor concatenation" -- inside smolvlm, ``self.k_cache = Tensor::cat(&[&self.k_cache, &k], 1)``)
- https://github.com/huggingface/transformers/pull/30536 ("Reduce by 2 the memory requirement in
  generate()")
- https://github.com/huggingface/transformers/pull/24115 ("Experiment with static past key/value buffer")

Reproduction: a tiny random-weight Idefics3 (SmolVLM architecture) provides 256 visual tokens per
128x128 image; a self-written 12-layer decoder captions 8 images at once for 16 steps. ``step`` takes
the previous cache tuple and returns a new one built with torch.cat, while the caller still holds
the old one; the twin writes into buffers allocated once for the whole caption.
"""

import _common as c
import torch
import torch.nn.functional as F

from memwarden.models import zoo

EXPECT = None

D, HEADS, LAYERS, VOCAB, NEW_TOKENS = 128, 4, 12, 2048, 16


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(D, 3 * D, bias=False)
        self.o = torch.nn.Linear(D, D, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D, 2 * D), torch.nn.GELU(), torch.nn.Linear(2 * D, D))
        self.n1, self.n2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)

    def forward(self, x, k_all, v_all, causal):
        q = self.qkv(self.n1(x))[..., :D]
        b, t, _ = x.shape
        q = q.view(b, t, HEADS, -1).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=causal)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, D))
        return x + self.mlp(self.n2(x))

    def kv(self, x):
        _, k, v = self.qkv(self.n1(x)).split(D, dim=-1)
        b, t, _ = x.shape
        return (k.view(b, t, HEADS, -1).transpose(1, 2), v.view(b, t, HEADS, -1).transpose(1, 2))


class CaptionDecoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = torch.nn.Linear(D, VOCAB, bias=False)

    def step(self, x, past, pos):
        """One forward over ``x`` (B, t, D) given the cache ``past``; returns logits and the new cache."""
        new_past = []
        for layer, (pk, pv) in zip(self.layers, past, strict=True):
            k, v = layer.kv(x)
            if pk is None:
                k_all, v_all = k, v
            else:
                k_all, v_all = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
            x = layer(x, k_all, v_all, causal=pk is None)
            new_past.append((k_all, v_all))
        return self.head(x[:, -1]), tuple(new_past)

    def step_static(self, x, past, pos):
        """Same, but ``past`` holds (k_buf, v_buf) allocated for the whole caption, written at ``pos``."""
        t = x.shape[1]
        for layer, (kb, vb) in zip(self.layers, past, strict=True):
            k, v = layer.kv(x)
            kb[:, :, pos : pos + t] = k
            vb[:, :, pos : pos + t] = v
            x = layer(x, kb[:, :, : pos + t], vb[:, :, : pos + t], causal=pos == 0)
        return self.head(x[:, -1]), past


def caption(decoder, prefix, new_tokens, step_fn, past):
    logits, past = step_fn(prefix, past, 0)
    pos, out = prefix.shape[1], []
    for _ in range(new_tokens):
        tok = logits.argmax(-1)
        out.append(tok)
        logits, past = step_fn(decoder.embed(tok)[:, None], past, pos)
        pos += 1
    return torch.stack(out, 1)


def main():
    torch.manual_seed(0)
    cfg = zoo.build_config("idefics3")
    cfg.vision_config.image_size, cfg.vision_config.patch_size = 128, 4
    cfg.text_config.hidden_size = D
    vlm = zoo.build_from_config("idefics3", cfg, seed=0)
    decoder = CaptionDecoder().eval()
    images = torch.randn(8, 1, 3, 128, 128, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        rows = [vlm.model.get_image_features(pixel_values=img[None]).pooler_output[0] for img in images]
        prefix = torch.stack(rows)  # (8, 256, D): one row of visual tokens per image
        b, t = prefix.shape[:2]
        shape = (b, HEADS, t + NEW_TOKENS + 1, D // HEADS)
        bufs = tuple((prefix.new_empty(shape), prefix.new_empty(shape)) for _ in range(LAYERS))
        ids = caption(decoder, prefix, NEW_TOKENS, decoder.step_static, bufs)
    kv = 2 * LAYERS * b * (t + ids.shape[1]) * D * 4
    print(f"{b} captions of {ids.shape[1]} tokens after a {t}-token visual prefix; final cache {c.mib(kv)}")


if __name__ == "__main__":
    main()
