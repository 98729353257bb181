"""Live captions for a long meeting stream with Whisper: every second a new 1 s chunk of audio
arrives, its log-mel frames are computed and the model re-transcribes the most recent 10 seconds.

The streamer keeps the chunk features in a deque(maxlen=WINDOW_S): older chunks are dropped as
new ones arrive, so the history never holds more than the window the model reads.
"""

import sys
from collections import deque

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = None
FIX_WORDS = ["deque", "maxlen", "drop old chunks"]

CHUNK_S = 1.0
WINDOW_S = 10
STREAM_CHUNKS = 600  # a 10-minute stand-up, one chunk per second
TRANSCRIBE_EVERY = 200
N_MELS = 80


class LiveCaptioner:
    def __init__(self, model):
        self.model = model
        self.mel_history = deque(maxlen=WINDOW_S)  # drop old chunks

    def feed(self, wave_chunk):
        mel = C.log_mel(wave_chunk, n_mels=N_MELS, frames=int(CHUNK_S * 100))
        self.mel_history.append(mel)

    @torch.no_grad()
    def caption(self):
        window = torch.cat(list(self.mel_history), dim=1).unsqueeze(0)
        return self.model.generate(input_features=window, max_new_tokens=4)


def microphone(n_chunks):
    base = C.fake_speech(CHUNK_S, seed=0)
    for i in range(n_chunks):
        yield base * (1.0 + 0.01 * (i % 7))


def main():
    model = C.whisper(d_model=128, layers=2, vocab=2048, window_s=float(WINDOW_S))
    live = LiveCaptioner(model)
    for i, chunk in enumerate(microphone(STREAM_CHUNKS)):
        live.feed(chunk)
        if (i + 1) % TRANSCRIBE_EVERY == 0:
            ids = live.caption()
            print(f"t={i + 1}s caption tokens {ids.shape[1]}")


if __name__ == "__main__":
    main()
