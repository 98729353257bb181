"""Qwen2-Audio-style QA over customer-call recordings: each call is cut to the encoder's 30-second
window, four calls are answered per generate call under no_grad, and only the answer ids are kept.
The 30 s window (750 audio tokens after pooling) is the model's native input size."""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

from memwarden.models import zoo

EXPECT = None

BATCH = 4


@torch.no_grad()
def main():
    model = C.qwen2_audio(window_s=30.0, audio_hidden=64, audio_layers=2, hidden=128, layers=2, vocab=4096)
    inputs = zoo.make_inputs(model, audio_seconds=30.0, prompt_tokens=24, batch=BATCH)
    out = model.generate(**inputs, max_new_tokens=8, **zoo.generate_kwargs("qwen2-audio"))
    print(out.shape)


if __name__ == "__main__":
    main()
