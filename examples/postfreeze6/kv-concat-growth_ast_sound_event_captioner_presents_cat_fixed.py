"""Sound-event captioning: an Audio Spectrogram Transformer encodes a 10 s clip, its patch embeddings
are projected into a small GPT-style decoder as a prefix (ClipCap-style), and captions are decoded
greedily with our own key/value cache.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import _common as C

EXPECT = None

D, HEADS, LAYERS, VOCAB = 256, 8, 16, 2048
MAX_NEW = 48


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x, layer_past, pos, max_len):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, HEADS, D // HEADS).transpose(1, 2) for t in (q, k, v))
        if layer_past is None:
            pk = k.new_zeros(B, HEADS, max_len, D // HEADS)
            pv = v.new_zeros(B, HEADS, max_len, D // HEADS)
        else:
            pk, pv = layer_past
        pk[:, :, pos : pos + T].copy_(k)
        pv[:, :, pos : pos + T].copy_(v)
        present = (pk, pv)
        k_all, v_all = present[0][:, :, : pos + T], present[1][:, :, : pos + T]
        a = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=T > 1)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.ln2(x)), present


class PrefixCaptioner(nn.Module):
    def __init__(self, audio_dim):
        super().__init__()
        self.prefix = nn.Linear(audio_dim, D)
        self.tok = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def step(self, x, past, pos, max_len):
        presents = []
        for blk, layer_past in zip(self.blocks, past):
            x, present = blk(x, layer_past, pos, max_len)
            presents.append(present)
        return self.head(self.ln(x[:, -1])), presents

    @torch.no_grad()
    def caption(self, audio_tokens, max_new=MAX_NEW):
        B = audio_tokens.shape[0]
        bos = self.tok(torch.full((B, 1), C.BOS_ID))
        x = torch.cat([self.prefix(audio_tokens), bos], dim=1)
        max_len = x.shape[1] + max_new
        out = []
        logits, past = self.step(x, [None] * LAYERS, 0, max_len)
        pos = x.shape[1]
        for _ in range(max_new):
            nxt = logits.argmax(-1, keepdim=True)
            out.append(nxt)
            logits, past = self.step(self.tok(nxt), past, pos, max_len)
            pos += 1
        return torch.cat(out, dim=1)


def main():
    torch.manual_seed(0)
    encoder = C.ast_encoder(hidden=64, layers=2, frames=1024)
    captioner = PrefixCaptioner(audio_dim=64).eval()
    clips = [C.fake_speech(10.24, seed=s) for s in range(4)]
    fbank = torch.stack([C.log_mel(w, n_mels=128, frames=1024).T for w in clips])  # (B, frames, mels)
    with torch.no_grad():
        audio_tokens = encoder(fbank).last_hidden_state
    captions = captioner.caption(audio_tokens)
    print(f"{len(clips)} clips: prefix {audio_tokens.shape[1]} tokens, captions {tuple(captions.shape)}")


if __name__ == "__main__":
    main()
