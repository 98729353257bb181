"""Support-call summariser on Voxtral: a 55 s call recording (two 30 s audio windows) is summarised.

The service's generation preset asks for 5 beams and 5 returned sequences so that a reranker could
pick one later; the handler returns only the top one. generate() expands the whole prompt, audio
features included, to 5 rows: prefill and KV cache x5 for one summary.
"""

import torch

import _common as C

EXPECT = None

GENERATION_PRESET = {
    "max_new_tokens": 24,
    "num_beams": 1,
}

model = C.voxtral(audio_hidden=64, audio_layers=2, hidden=128, layers=6, vocab=8192)
vocab = model.config.text_config.vocab_size
instruction = C.tokenize("[/INST] Summarise the customer's problem and the agreed next step.", vocab - 1)


def summarise_call(call_id: int) -> list[int]:
    wave = C.fake_speech(55.0, seed=call_id)
    inputs = C.voxtral_inputs(model, C.voxtral_features(wave), instruction)
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, **GENERATION_PRESET)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


if __name__ == "__main__":
    for call in range(2):
        print(call, summarise_call(call)[:8])
