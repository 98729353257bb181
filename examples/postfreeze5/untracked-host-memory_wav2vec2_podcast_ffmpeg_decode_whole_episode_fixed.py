import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""Transcribing podcast episodes with a wav2vec2 CTC model in 30 s windows. The decoder's
PCM output is streamed one 30 s block at a time (librosa.stream-style), converted and fed to the model,
so only one window of audio is in host memory at a time."""

import numpy as np
import torch

EXPECT = None

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


def stream_audio(episode_id):
    for block in ffmpeg_blocks(episode_id):  # one 30 s block of PCM at a time
        yield to_model_rate(block)


@torch.no_grad()
def transcribe(model, episode_id):
    ids = []
    for chunk in stream_audio(episode_id):
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
