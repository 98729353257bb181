"""Captioning a folder of images with a LLaVA-1.5-style model and collecting image-conditioned
embeddings from ``generate(..., output_hidden_states=True)`` — keeping every full output object.

Source: https://github.com/huggingface/transformers/issues/2595
  "I am trying to retrieve hidden state vectors from my trained GPT-2 model from a loop, and there
   is a huge RAM leakage associated with the operation."
See also https://github.com/huggingface/transformers/issues/31229 (``model.generate(...,
output_hidden_states=True, return_dict_in_generate=True)`` then ``outputs.hidden_states`` per step).

The user wants, per image, the caption and the last-layer hidden state of the last prompt token.
They append the whole ``GenerateDecoderOnlyOutput`` to a list: each one carries the hidden states
of every layer for every prompt position (256 image tokens + text) and for every decode step, plus
the request's KV cache, so memory grows by all of that per image.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = "retained-outputs"
FIX_WORDS = ("sequences", "del", "clone", "hidden_states", "only")

N_IMAGES = 5
NEW_TOKENS = 4


def main() -> None:
    torch.manual_seed(0)
    model = c.llava(image_px=224, patch_px=14, hidden=256, layers=4, vocab=4096)
    gen = zoo.generate_kwargs("llava")
    results = []
    with torch.no_grad():
        for i in range(N_IMAGES):
            inputs = zoo.make_inputs(model, prompt_tokens=24, seed=i)
            out = model.generate(
                **inputs, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, output_hidden_states=True, **gen
            )
            results.append(out)  # MISTAKE
    captions = [r.sequences[0, -NEW_TOKENS:].tolist() for r in results]
    embeddings = torch.cat([r.hidden_states[0][-1][:, -1] for r in results])  # prefill, last layer, last token
    print(f"{len(captions)} captions, embeddings {tuple(embeddings.shape)}")


if __name__ == "__main__":
    main()
