"""Batch transcription of smart-home voice commands with SpeechT5 ASR: 16 clips per batch, padded
to the longest clip of the batch, greedy decoding under inference_mode."""

import torch

import _common as C

EXPECT = None
BATCH = 16


def collate(waves):
    longest = max(len(w) for w in waves)
    x = torch.zeros(len(waves), longest)
    att = torch.zeros(len(waves), longest, dtype=torch.long)
    for i, w in enumerate(waves):
        x[i, : len(w)] = torch.from_numpy(w)
        att[i, : len(w)] = 1
    return x, att


@torch.inference_mode()
def main():
    torch.manual_seed(0)
    model = C.speecht5_asr(hidden=128, layers=2, vocab=96)
    waves = [C.fake_speech(1.2 + 0.05 * (i % 9), seed=i) for i in range(32)]
    texts = []
    for i in range(0, len(waves), BATCH):
        x, att = collate(waves[i : i + BATCH])
        out = model.generate(input_values=x, attention_mask=att, max_new_tokens=20, do_sample=False)
        texts += out.tolist()
    print(f"{len(texts)} commands transcribed")


if __name__ == "__main__":
    main()
