"""Qwen2-Audio transcription job that decodes the whole audio column before the first clip is run.

What the user did: clips from an audio dataset are transcribed with Qwen2-Audio. The script first
reads ``ds["audio"]`` (all rows), which decodes and keeps every clip's 48 kHz float waveform in a
Python list of numpy arrays, and then loops over that list. The decoded arrays live in host memory
outside torch for the whole job although each clip is needed once.
Answer in the source: access one example at a time (``ds[i]["audio"]``), or map/iterate so that only
the current batch is decoded; querying the column decodes and resamples every file up front.
Sources: https://github.com/huggingface/datasets/pull/3222 ; https://github.com/huggingface/datasets/issues/7117
Reproduction: a tiny random-weight Qwen2-Audio (10 s window); 32 clips of 10 s decoded at 48 kHz
(61 MB of float32 arrays kept in a list), each resampled to 16 kHz, turned into a log-mel window
and transcribed with a 4-token ``generate``.
"""

import _common as c
import numpy as np
import torch

from memwarden.models import zoo

EXPECT = "untracked-host-memory"
FIX_WORDS = ("one at a time", "lazily", "ds[i]", "generator", "iterate")

N_CLIPS = 32
SECONDS = 10.0
NATIVE_SR = 48000


def decode(path: int) -> np.ndarray:
    """The dataset's Audio feature: decode one file to a float32 waveform at its native rate."""
    return c.fake_speech(SECONDS, sr=NATIVE_SR, seed=path)


def transcribe(model, wave48k: np.ndarray, template: dict) -> list[int]:
    wave = np.ascontiguousarray(wave48k[::3])  # resample to 16 kHz
    mel = c.log_mel(wave, n_mels=128, frames=int(SECONDS * 100))
    inputs = dict(template, input_features=mel.unsqueeze(0))
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def main() -> None:
    model = c.qwen2_audio(window_s=SECONDS, hidden=64, layers=2, vocab=2048)
    template = zoo.make_inputs(model, audio_seconds=SECONDS, prompt_tokens=16)
    paths = list(range(N_CLIPS))
    texts = []
    with torch.inference_mode():
        audio_column = [decode(p) for p in paths]  # MISTAKE
        for wave in audio_column:
            texts.append(transcribe(model, wave, template))
    print(f"{len(texts)} clips transcribed; first: {texts[0]}")


if __name__ == "__main__":
    main()
