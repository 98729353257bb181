"""A whisperX-style pipeline: transcribe with Whisper, then load a wav2vec2 CTC model to align the
words, for a batch of podcast files.

Whisper is deleted (and garbage-collected) before the alignment model is loaded, so only one of
the two models is in memory at a time.
"""

import gc
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = None
FIX_WORDS = ["del", "gc.collect", "unload"]

models = {}


def load_asr():
    return C.whisper(d_model=512, layers=4, vocab=16000, window_s=10.0)


def load_align():
    return C.wav2vec2_ctc(hidden=512, layers=6, vocab=64)


@torch.no_grad()
def transcribe(asr, wave):
    mel = C.log_mel(wave, frames=1000).unsqueeze(0)
    return asr.generate(input_features=mel, max_new_tokens=8)


@torch.no_grad()
def align(aligner, wave):
    emissions = aligner(torch.from_numpy(wave).unsqueeze(0)).logits.log_softmax(-1)
    return emissions.argmax(-1)


def process(wave):
    models["asr"] = load_asr()
    tokens = transcribe(models["asr"], wave)
    del models["asr"]  # unload Whisper before loading the aligner
    gc.collect()
    models["align"] = load_align()
    path = align(models["align"], wave)
    return tokens, path


def main():
    wave = C.fake_speech(8.0)
    tokens, path = process(wave)
    print(tokens.shape, path.shape)


if __name__ == "__main__":
    main()
