"""Fixed twin of ``chat_resend_image.py``: the KV cache is kept between turns.

Source: https://github.com/abetlen/llama-cpp-python/issues/2222 ("Once an image has been
encoded, the result can be reused"): the cache is kept and the image sent once.

Each turn asks generate() for its cache (``return_dict_in_generate=True``) and passes it back
the next turn (``cache=out.cache``; ``past_key_values`` in transformers 4) with the full
conversation ids. generate() then feeds only the ids the cache does not hold yet -- the new
question -- and ``pixel_values`` go with the first turn only, so the vision tower encodes the
image once. Greedy answers equal the original's.

Run: ``python chat_resend_image_fixed.py`` or ``memwarden trace chat_resend_image_fixed.py``.
"""

from __future__ import annotations

import torch

from memwarden.models import zoo

EXPECT = None

TURNS, NEW_TOKENS, QUESTION_TOKENS = 4, 8, 12


def main() -> None:
    model = zoo.build_model("llava")
    gen = zoo.generate_kwargs("llava")
    first = zoo.make_inputs(model, prompt_tokens=32)  # BOS, instruction, <image> x 16, first question
    ids = first["input_ids"]  # (1, T)
    media = {"pixel_values": first["pixel_values"]}  # sent once, with the turn that shows the image
    cache = None
    questions = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for turn in range(TURNS):
            if turn:
                question = torch.randint(3, 1000, (1, QUESTION_TOKENS), generator=questions)
                ids = torch.cat([ids, question], dim=1)
            kept = {} if cache is None else {"cache": cache}
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                return_dict_in_generate=True, **media, **kept, **gen,
            )  # fmt: skip
            ids, cache, media = out.sequences, out.cache, {}
            print(f"turn {turn}: {ids.shape[1]} tokens, answer {ids[0, -NEW_TOKENS:].tolist()}")


if __name__ == "__main__":
    main()
