import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""Speech-emotion tagging of call-centre snippets (2-6 s each) with a HuBERT classifier: 32 snippets
per batch, padded to the longest snippet of the batch with an attention mask, run under
torch.inference_mode(); only the predicted label ids are kept."""

import numpy as np
import torch

EXPECT = None

EMOTIONS = ["neutral", "happy", "angry", "sad"]


def collate(waves):
    longest = max(len(w) for w in waves)
    x = torch.zeros(len(waves), longest)
    mask = torch.zeros(len(waves), longest, dtype=torch.long)
    for i, w in enumerate(waves):
        x[i, : len(w)] = torch.from_numpy((w - w.mean()) / (w.std() + 1e-7))
        mask[i, : len(w)] = 1
    return x, mask


def main():
    torch.manual_seed(0)
    model = C.wav2vec2_classifier(hidden=128, layers=4, num_labels=len(EMOTIONS), kind="hubert")
    rng = np.random.default_rng(0)
    snippets = [C.fake_speech(float(rng.uniform(2.0, 6.0)), seed=i) for i in range(128)]
    labels = []
    with torch.inference_mode():
        for i in range(0, len(snippets), 32):
            x, mask = collate(snippets[i : i + 32])
            labels += model(x, attention_mask=mask).logits.argmax(-1).tolist()
    print("label counts:", np.bincount(labels, minlength=len(EMOTIONS)).tolist())


if __name__ == "__main__":
    main()
