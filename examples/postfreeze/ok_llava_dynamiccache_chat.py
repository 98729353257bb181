"""Correct library path: a multi-turn chat about one image with a LLaVA-style model where a single
``DynamicCache`` is passed back to ``generate`` every turn. The image is encoded once (turn 0);
later turns send the full token history and ``generate`` prefills only the tokens the cache does
not hold yet. The cache growing turn after turn is the conversation itself, not a leak.

Source: https://huggingface.co/docs/transformers/v4.51.1/kv_cache — re-use a cache object across
``generate`` calls to continue a conversation instead of recomputing the prefix.
See also https://github.com/fpgaminer/joycaption/issues/56 (the re-sending alternative: "I have to
pass an image to every conversational step").
"""

import _common as c
import torch
from transformers import DynamicCache

from memwarden.models import zoo

EXPECT = None

TURNS = 5


def main() -> None:
    torch.manual_seed(0)
    model = c.llava(image_px=336, patch_px=14, hidden=128, layers=4, vocab=4096)
    gen = zoo.generate_kwargs("llava")
    first = zoo.make_inputs(model, prompt_tokens=24)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        history = model.generate(**first, cache=cache, max_new_tokens=8, **gen)
        for turn in range(1, TURNS):
            question = c.text_ids(12, model.config.image_token_id, seed=turn)
            history = torch.cat([history, question], dim=1)
            history = model.generate(
                input_ids=history, attention_mask=torch.ones_like(history), cache=cache, max_new_tokens=8, **gen
            )
            print(f"turn {turn}: {history.shape[1]} tokens in the conversation, cache {cache.get_seq_length()}")


if __name__ == "__main__":
    main()
