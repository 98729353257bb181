import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""Transcribing podcast episodes with a wav2vec2 CTC model in 30 s windows. `load_audio()` follows
the usual whisper/whisperX recipe: decode the whole episode with ffmpeg to a bytes buffer, view it as
int16, convert to float32, downmix and resample, and only then cut windows. For a 12-minute 48 kHz
stereo episode the raw bytes, the float copies and the resampled waveform all sit in host memory
(numpy, outside torch) although the model only ever sees one 30 s window."""

import numpy as np
import torch

EXPECT = "untracked-host-memory"
FIX_WORDS = ("stream", "chunk", "blocks", "read only", "generator")

SRC_SR, SR, WINDOW_S = 48000, 16000, 30
EPISODE_S = 12 * 60


def ffmpeg_blocks(episode_id, block_s=WINDOW_S):
    """Stands in for `ffmpeg -i episode.mp3 -f s16le -ac 2 -ar 48000 -`: yields raw PCM bytes."""
    for i in range(EPISODE_S // block_s):
        rng = np.random.default_rng(1000 * episode_id + i)
        yield rng.integers(-3000, 3000, size=(block_s * SRC_SR, 2), dtype=np.int16).tobytes()


def to_model_rate(pcm_bytes):
    stereo = np.frombuffer(pcm_bytes, np.int16).reshape(-1, 2).astype(np.float32) / 32768.0
    mono = stereo.mean(axis=1)
    return np.ascontiguousarray(mono[:: SRC_SR // SR])  # 48k -> 16k (decimation stands in for resampling)


def load_audio(episode_id):
    out = b"".join(ffmpeg_blocks(episode_id))  # MISTAKE
    return to_model_rate(out)


def windows(audio):
    for start in range(0, len(audio), WINDOW_S * SR):
        yield audio[start : start + WINDOW_S * SR]


@torch.no_grad()
def transcribe(model, episode_id):
    ids = []
    for chunk in windows(load_audio(episode_id)):
        x = torch.from_numpy(chunk).unsqueeze(0)
        x = (x - x.mean()) / (x.std() + 1e-7)
        ids.append(model(x).logits.argmax(-1)[0])
    return torch.cat(ids)


def main():
    torch.manual_seed(0)
    model = C.wav2vec2_ctc(hidden=128, layers=2, vocab=32)
    tokens = transcribe(model, episode_id=7)
    print("CTC frames:", tokens.numel())


if __name__ == "__main__":
    main()
