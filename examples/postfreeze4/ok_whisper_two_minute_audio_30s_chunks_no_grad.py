"""Long-form transcription of a 2-minute recording with a Whisper-style model: the audio is cut into
the model's native 30-second windows, each window is transcribed greedily under no_grad, and only
the token ids are kept. The 30 s window is what the model was trained on (1500 encoder positions),
so each window is legitimately large."""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = None

SR = 16000
WINDOW_S = 30


@torch.no_grad()
def main():
    model = C.whisper(d_model=256, layers=2, vocab=4096, window_s=float(WINDOW_S))
    wave = C.fake_speech(120.0)
    pieces = []
    for start in range(0, len(wave), WINDOW_S * SR):
        chunk = wave[start : start + WINDOW_S * SR]
        mel = C.log_mel(chunk, frames=WINDOW_S * 100).unsqueeze(0)
        ids = model.generate(input_features=mel, max_new_tokens=16)
        pieces.append(ids[0].tolist())
    print([len(p) for p in pieces])


if __name__ == "__main__":
    main()
