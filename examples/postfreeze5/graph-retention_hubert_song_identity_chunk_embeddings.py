import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""A voice-identity check for generated songs (MERT/HuBERT-style audio encoder): `embed()` slices a
full song into 5 s chunks, runs the encoder on each and mean-pools the last hidden state. The model is
in eval mode but nothing disables autograd, so every pooled chunk vector keeps its chunk's whole
activation graph alive until the song embedding is stacked and compared."""

import numpy as np
import torch

EXPECT = "graph-retention"
FIX_WORDS = ("no_grad", "inference_mode", "detach", "requires_grad")

SR = 16000
CHUNK_S = 5


def embed(model, wave):
    pooled = []
    for start in range(0, len(wave) - SR, CHUNK_S * SR):
        chunk = torch.from_numpy(wave[start : start + CHUNK_S * SR]).unsqueeze(0)
        hidden = model.hubert(chunk).last_hidden_state
        pooled.append(hidden.reshape(-1, hidden.shape[-1]).float().mean(0))  # MISTAKE
    return torch.stack(pooled).mean(0)


def main():
    torch.manual_seed(0)
    model = C.wav2vec2_classifier(hidden=128, layers=4, kind="hubert")
    reference = C.fake_speech(20.0, seed=1)
    candidates = [C.fake_speech(20.0, seed=10 + i) for i in range(3)]
    ref_emb = embed(model, reference)
    scores = []
    for song in candidates:
        emb = embed(model, song)
        scores.append(float(torch.nn.functional.cosine_similarity(ref_emb, emb, dim=0)))
    print("identity scores:", np.round(scores, 3).tolist())


if __name__ == "__main__":
    main()
