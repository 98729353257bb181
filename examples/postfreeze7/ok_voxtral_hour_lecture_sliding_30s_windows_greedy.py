"""Voxtral transcription of a 2-minute lecture excerpt: the processor cuts the audio into the
model's native 30 s windows (4 windows, 375 audio tokens each, as in the model card's long-audio
transcription mode) and one greedy generate transcribes them under no_grad."""

import torch

import _common as C

EXPECT = None

model = C.voxtral(audio_hidden=64, audio_layers=2, hidden=128, layers=4, vocab=8192)
vocab = model.config.text_config.vocab_size
instruction = C.tokenize("[/INST] lang:en [TRANSCRIBE]", vocab - 1)

if __name__ == "__main__":
    feats = C.voxtral_features(C.fake_speech(120.0, seed=1))
    inputs = C.voxtral_inputs(model, feats, instruction)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=48, do_sample=False)
    print(
        "windows:",
        feats.shape[0],
        "audio tokens:",
        feats.shape[0] * C.voxtral_tokens_per_window(model),
        "text:",
        out.shape[1] - inputs["input_ids"].shape[1],
    )
