"""Voicemail triage on Voxtral: each voicemail (one 30 s window) gets a short "urgent / callback /
spam" label. To calibrate a confidence threshold later, the worker asks generate() for a dict with
scores and keeps every returned GenerateDecoderOnlyOutput in a list; each one also carries the
request's past_key_values (375 audio tokens + prompt, every layer) and the per-step 16k-way scores.
"""

import torch

import _common as C

EXPECT = "retained-outputs"
FIX_WORDS = ["sequences", "scores", "past_key_values", "keep", "dict"]

N_VOICEMAILS = 12

model = C.voxtral(audio_hidden=64, audio_layers=2, hidden=128, layers=6, vocab=16384)
vocab = model.config.text_config.vocab_size
instruction = C.tokenize("[/INST] Label this voicemail: urgent, callback or spam. Then give a reason.", vocab - 1)


@torch.no_grad()
def triage(i: int):
    inputs = C.voxtral_inputs(model, C.voxtral_features(C.fake_speech(8.0 + i % 5, seed=i)), instruction)
    out = model.generate(**inputs, max_new_tokens=8, do_sample=False, return_dict_in_generate=True, output_scores=True)
    return out, inputs["input_ids"].shape[1]


if __name__ == "__main__":
    kept = []
    for i in range(N_VOICEMAILS):
        out, n_prompt = triage(i)
        kept.append(out)  # MISTAKE
    first = kept[0]
    print("voicemails:", len(kept), "kept type:", type(first).__name__)
