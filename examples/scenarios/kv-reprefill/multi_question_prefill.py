"""Several questions about one image, each asked with a fresh generate() over system prompt + image.

What is wrong: a captioning/VQA service answers 4 questions about the same image.
For each question it builds ``system prompt + image + question`` and calls
``model.generate()`` from scratch. Each call encodes the same pixels with the
vision tower again and prefills the same 64-token prefix (system prompt and the
image's placeholder tokens) again: 3 of the 4 encodes and 3 of the 4 prefix
prefills recompute what the first call had already computed.

The fix (``multi_question_prefill_fixed.py``): run the shared prefix once
(one forward over system prompt + image, ``use_cache=True``), then for each
question pass a copy of that prefix cache to generate()
(``cache=copy.deepcopy(prefix_cache)``) with the full ids and no
``pixel_values``: only the question is prefilled, and the image is encoded
once. Greedy answers are the same.

Run: ``python multi_question_prefill.py`` or ``memwarden trace multi_question_prefill.py``.
"""

from __future__ import annotations

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
        for i, question in enumerate(questions):
            ids = torch.cat([prefix["input_ids"], question], dim=1)  # (1, 64 + 12)
            # the mistake: prefix and image encoded and prefilled from scratch for every question
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=prefix["pixel_values"],
                max_new_tokens=NEW_TOKENS, **gen,
            )  # fmt: skip
            print(f"question {i}: answer {out[0, -NEW_TOKENS:].tolist()}")


if __name__ == "__main__":
    main()
