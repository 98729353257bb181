"""Fixed twin of retained-outputs_llava_hidden_states: per image, keep only the generated token
ids and a cloned copy of the one hidden vector that is needed, and let the full output go.

Source: https://github.com/huggingface/transformers/issues/2595
  "I am trying to retrieve hidden state vectors from my trained GPT-2 model from a loop, and there
   is a huge RAM leakage associated with the operation."
``.clone()`` matters: ``hidden[:, -1]`` alone is a view that would keep the whole (1, T, H) tensor alive.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None

N_IMAGES = 5
NEW_TOKENS = 4


def main() -> None:
    torch.manual_seed(0)
    model = c.llava(image_px=224, patch_px=14, hidden=256, layers=4, vocab=4096)
    gen = zoo.generate_kwargs("llava")
    captions, embeddings = [], []
    with torch.no_grad():
        for i in range(N_IMAGES):
            inputs = zoo.make_inputs(model, prompt_tokens=24, seed=i)
            out = model.generate(
                **inputs, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, output_hidden_states=True, **gen
            )
            captions.append(out.sequences[0, -NEW_TOKENS:].tolist())
            embeddings.append(out.hidden_states[0][-1][:, -1].clone())
            del out
    embeddings = torch.cat(embeddings)
    print(f"{len(captions)} captions, embeddings {tuple(embeddings.shape)}")


if __name__ == "__main__":
    main()
