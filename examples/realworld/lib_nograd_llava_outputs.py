"""LLaVA forward passes under ``torch.no_grad()`` whose full outputs are kept for later scoring.

Source: memwarden issue 14 ("graph-retention fires under torch.no_grad() (a LLaVA output alone
spans logits, vision hidden states and the projector)"); the pattern is the transformers docs'
``outputs = model(**inputs)`` under no_grad, e.g. https://huggingface.co/docs/transformers/model_doc/llava

No autograd graph exists: nothing here is retained for a backward, so it is not graph-retention.
It was a clean case until the catalogue named ``retained-outputs`` (issue 45): every request's
whole output, with all its hidden states, stays alive in ``outputs`` while only the logits' shape
is read. Relabelled as that pattern's case, the ``append`` the line to change.
"""

from __future__ import annotations

import torch

from memwarden.models import zoo

EXPECT = "retained-outputs"
FIX_WORDS = ("hidden_states", "logits")
REQUESTS = 4


def main() -> None:
    model = zoo.build_model("llava")
    outputs = []
    with torch.no_grad():
        for seed in range(REQUESTS):
            inputs = zoo.make_inputs(model, prompt_tokens=24, seed=seed)
            outputs.append(model(**inputs, output_hidden_states=True))  # MISTAKE
    print([tuple(o.logits.shape) for o in outputs])


if __name__ == "__main__":
    main()
