"""CosyVoice-style speech-token LM whose stacked attention cache is grown with ``torch.cat`` per step.

What the user did: the TTS language model decodes speech tokens one at a time with a hand-written
transformer that keeps one stacked ``att_cache`` of shape (layers, batch, heads, T, 2*head_dim).
Every step concatenates the new keys/values onto it with ``torch.cat``, which allocates a new,
one-step-longer cache and copies the old one while it is still referenced: each step briefly holds
two full caches and re-copies everything decoded so far.
Answer in the source: remove the concatenation handling of the KV cache; preallocate the cache for
the maximum length once and write each step's key/value into ``cache[..., step, :]`` in place.
Sources: https://github.com/QwenAudio/CosyVoice/pull/220 ; https://github.com/rasbt/LLMs-from-scratch/pull/705
Reproduction: a Whisper encoder (tiny random-weight transformers config) embeds a 3 s prompt
utterance; a random-weight 8-layer decoder (d=256, 8 heads) prefills prompt + text and decodes 300
speech tokens with the concatenated stacked cache.
"""

import math

import _common as c
import torch
from torch import nn

EXPECT = "kv-concat-growth"
FIX_WORDS = ("preallocate", "in place", "index_copy", "static cache")

LAYERS, D, HEADS = 8, 256, 8
HD = D // HEADS
N_SPEECH = 300


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)
        self.ff = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.n1, self.n2 = nn.LayerNorm(D), nn.LayerNorm(D)

    def forward(self, x, kv_past):
        """x: (B, t, D); kv_past: (B, H, T, 2*HD) or None. Returns x and this step's (B, H, t, 2*HD)."""
        b, t, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, HEADS, HD).permute(2, 0, 3, 1, 4)
        new_kv = torch.cat([k, v], dim=-1)
        kv = new_kv if kv_past is None else torch.cat([kv_past, new_kv], dim=2)
        k_all, v_all = kv.split(HD, dim=-1)
        att = torch.nn.functional.scaled_dot_product_attention(q, k_all, v_all, is_causal=kv_past is None)
        x = x + self.out(att.transpose(1, 2).reshape(b, t, D))
        return x + self.ff(self.n2(x)), new_kv


class SpeechLM(nn.Module):
    def __init__(self, n_speech_tokens=4096):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.emb = nn.Embedding(n_speech_tokens, D)
        self.head = nn.Linear(D, n_speech_tokens)


def main() -> None:
    torch.manual_seed(0)
    encoder = c.whisper(d_model=D, layers=2, window_s=3.0).model.encoder
    lm = SpeechLM().eval()
    with torch.inference_mode():
        mel = c.log_mel(c.fake_speech(3.0), n_mels=80, frames=300).unsqueeze(0)
        prompt = encoder(mel).last_hidden_state  # (1, 150, D)
        text = lm.emb(torch.randint(0, 4096, (1, 40)))
        x = torch.cat([prompt, text], 1)
        att_cache = torch.zeros(LAYERS, 1, HEADS, 0, 2 * HD)
        tokens = []
        for _step in range(N_SPEECH):
            steps = []
            for i, layer in enumerate(lm.layers):
                x, kv = layer(x, att_cache[i] if att_cache.shape[3] else None)
                steps.append(kv)
            att_cache = torch.cat([att_cache, torch.stack(steps)], dim=3)  # MISTAKE
            tok = int(lm.head(x[:, -1]).argmax())
            tokens.append(tok)
            x = lm.emb(torch.tensor([[tok]])) / math.sqrt(D)
    print(f"{len(tokens)} speech tokens, cache {tuple(att_cache.shape)}")


if __name__ == "__main__":
    main()
