"""LLaVA forward passes under ``torch.no_grad()`` whose full outputs are kept for later scoring.

Source: memwarden issue 14 ("graph-retention fires under torch.no_grad() (a LLaVA output alone
spans logits, vision hidden states and the projector)"); the pattern is the transformers docs'
``outputs = model(**inputs)`` under no_grad, e.g. https://huggingface.co/docs/transformers/model_doc/llava

No autograd graph exists: nothing here is retained for a backward.
"""

from __future__ import annotations

import torch

from memwarden.models import zoo

EXPECT = None
REQUESTS = 4


def main() -> None:
    model = zoo.build_model("llava")
    outputs = []
    with torch.no_grad():
        for seed in range(REQUESTS):
            inputs = zoo.make_inputs(model, prompt_tokens=24, seed=seed)
            outputs.append(model(**inputs, output_hidden_states=True))
    print([tuple(o.logits.shape) for o in outputs])


if __name__ == "__main__":
    main()
