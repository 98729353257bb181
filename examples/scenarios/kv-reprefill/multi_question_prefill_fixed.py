"""Fixed twin of ``multi_question_prefill.py``: the shared prefix is encoded and prefilled once.

One forward over system prompt + image (``use_cache=True``) builds the prefix cache; each
question then calls generate() with the full ids and a copy of that cache
(``cache=copy.deepcopy(prefix_cache)``, ``past_key_values`` in transformers 4) and no
``pixel_values``. generate() prefills only the question's tokens, and the vision tower runs
once for all questions. Greedy answers equal the original's.

Run: ``python multi_question_prefill_fixed.py`` or ``memwarden trace multi_question_prefill_fixed.py``.
"""

from __future__ import annotations

import copy

import torch

from memwarden.models import zoo

QUESTIONS, QUESTION_TOKENS, NEW_TOKENS = 4, 12, 6


def main() -> None:
    model = zoo.build_model("llava")
    gen = zoo.generate_kwargs("llava")
    prefix = zoo.make_inputs(model, prompt_tokens=48)  # system prompt with the image's 16 placeholders
    rng = torch.Generator().manual_seed(2)
    questions = [torch.randint(3, 1000, (1, QUESTION_TOKENS), generator=rng) for _ in range(QUESTIONS)]
    with torch.no_grad():
        prefix_cache = model(**prefix, use_cache=True).cache  # image encoded, prefix prefilled: once
        for i, question in enumerate(questions):
            ids = torch.cat([prefix["input_ids"], question], dim=1)  # (1, 64 + 12)
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), cache=copy.deepcopy(prefix_cache),
                max_new_tokens=NEW_TOKENS, **gen,
            )  # fmt: skip
            print(f"question {i}: answer {out[0, -NEW_TOKENS:].tolist()}")


if __name__ == "__main__":
    main()
