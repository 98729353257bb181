"""Batch transcription with a Whisper encoder and a small hand-written text decoder written the way
ONNX-exported Whisper decoders are driven: the decoder takes one `past` tensor holding the keys and
values of every layer, (layers, 2, batch, heads, T, head_dim), and returns the new token's `present`.

The driver loop grows `past` with torch.cat at every step: each step allocates a new copy of the
whole cache, one token longer, while the old one is still alive.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch
import torch.nn.functional as F

EXPECT = "kv-concat-growth"
FIX_WORDS = ["preallocate", "static cache", "in place"]

BATCH = 64
MAX_TOKENS = 160
D_MODEL = 256
N_HEAD = 8
N_LAYER = 2


class DecoderLayer(torch.nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.cross_q = torch.nn.Linear(d, d)
        self.cross_kv = torch.nn.Linear(d, 2 * d)
        self.cross_out = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def heads(self, x):
        b, t, d = x.shape
        return x.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)

    def forward(self, x, past_kv, cross_kv):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        present = torch.stack([self.heads(k), self.heads(v)])
        keys = torch.cat([past_kv[0], present[0]], dim=2)
        values = torch.cat([past_kv[1], present[1]], dim=2)
        y = F.scaled_dot_product_attention(self.heads(q), keys, values)
        x = x + self.out(y.transpose(1, 2).flatten(2))
        y = F.scaled_dot_product_attention(self.heads(self.cross_q(x)), cross_kv[0], cross_kv[1])
        x = x + self.cross_out(y.transpose(1, 2).flatten(2))
        return x + self.mlp(x), present


class TinyDecoder(torch.nn.Module):
    def __init__(self, vocab, d, n_head, n_layer):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(448, d)
        self.layers = torch.nn.ModuleList(DecoderLayer(d, n_head) for _ in range(n_layer))

    def cross_cache(self, audio):
        return [torch.stack([layer.heads(t) for t in layer.cross_kv(audio).chunk(2, dim=-1)]) for layer in self.layers]

    def forward(self, tokens, past, cross, offset):
        """past: (L, 2, B, H, T, hd); returns logits and present (L, 2, B, H, 1, hd)."""
        x = self.emb(tokens) + self.pos.weight[offset : offset + tokens.shape[1]]
        presents = []
        for i, layer in enumerate(self.layers):
            x, present = layer(x, past[i], cross[i])
            presents.append(present)
        return x[:, -1] @ self.emb.weight.T, torch.stack(presents)


def empty_past(batch):
    hd = D_MODEL // N_HEAD
    return torch.zeros(N_LAYER, 2, batch, N_HEAD, 0, hd)


@torch.no_grad()
def transcribe(encoder, decoder, mels):
    audio = torch.cat([encoder(chunk).last_hidden_state for chunk in mels.split(8)])
    cross = decoder.cross_cache(audio)
    past = empty_past(mels.shape[0])
    tokens = torch.full((mels.shape[0], 1), C.BOS_ID)
    out = [tokens]
    for step in range(MAX_TOKENS):
        logits, present = decoder(tokens, past, cross, step)
        past = torch.cat([past, present], dim=4)  # MISTAKE
        tokens = logits.argmax(-1, keepdim=True)
        out.append(tokens)
    return torch.cat(out, dim=1)


def main():
    torch.manual_seed(0)
    whisper = C.whisper(d_model=D_MODEL, layers=2, vocab=2048, window_s=2.0)
    encoder = whisper.get_encoder()
    decoder = TinyDecoder(2048, D_MODEL, N_HEAD, N_LAYER).eval()
    mels = torch.stack([C.log_mel(C.fake_speech(2.0, seed=i), frames=200) for i in range(BATCH)])
    ids = transcribe(encoder, decoder, mels)
    print(ids.shape)


if __name__ == "__main__":
    main()
