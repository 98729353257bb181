"""A multi-turn chat about one image that resends the whole conversation, image included, each turn.

Source: https://github.com/abetlen/llama-cpp-python/issues/2222
    "In multi-turn conversations that include images, the image encoding is performed on each
     turn. ... Once an image has been encoded, the result can be reused, rather than re-encoding
     every turn."
and https://github.com/haotian-liu/LLaVA/issues/1412 (multi-turn: the second turn is text only).

What is wrong: every turn calls ``model.generate()`` with the full conversation so
far (image placeholders, previous questions and answers, the new question) and
the image's ``pixel_values``, and keeps nothing between calls. So each turn the
vision tower encodes the same pixels again and the language model recomputes the
KV cache of everything the previous turn had already computed: over 4 turns the
image is encoded 4 times and the first turn's prompt is prefilled 4 times.

The fix (``chat_resend_image_fixed.py``): keep the cache. Ask generate() for it
(``return_dict_in_generate=True``), pass it back the next turn
(``cache=out.cache``; ``past_key_values`` in transformers 4) with the full
ids, and send ``pixel_values`` only with the turn that introduces the image:
generate() then prefills only the new question and the vision tower runs once.
Greedy answers are the same.

Run: ``python chat_resend_image.py`` or ``memwarden trace chat_resend_image.py``.
"""

from __future__ import annotations

import torch

from memwarden.models import zoo

EXPECT = "kv-reprefill"
FIX_WORDS = ("cache",)

TURNS, NEW_TOKENS, QUESTION_TOKENS = 4, 8, 12


def main() -> None:
    model = zoo.build_model("llava")
    gen = zoo.generate_kwargs("llava")
    first = zoo.make_inputs(model, prompt_tokens=32)  # BOS, instruction, <image> x 16, first question
    pixel_values = first["pixel_values"]  # (1, 3, 32, 32)
    ids = first["input_ids"]  # (1, T)
    questions = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for turn in range(TURNS):
            if turn:
                question = torch.randint(3, 1000, (1, QUESTION_TOKENS), generator=questions)
                ids = torch.cat([ids, question], dim=1)
            # the mistake: the whole conversation and the image again, no cache kept
            ids = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixel_values,
                max_new_tokens=NEW_TOKENS, **gen,
            )  # fmt: skip
            print(f"turn {turn}: {ids.shape[1]} tokens, answer {ids[0, -NEW_TOKENS:].tolist()}")


if __name__ == "__main__":
    main()
