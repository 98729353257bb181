"""Fixed twin of kv-reprefill_qwen2audio_voice_chat: one ``DynamicCache`` lives across the turns.
Turn 0 encodes the clip and prefills it; later turns pass the full token history with the cache,
so ``generate`` only prefills the tokens the cache does not hold yet (the new question) and the
audio is never encoded again.

Source: https://github.com/fpgaminer/joycaption/issues/56 ("I have to pass an image to every
conversational step"); cache re-use across calls:
https://huggingface.co/docs/transformers/v4.51.1/kv_cache
"""

import _common as c
import torch
from transformers import DynamicCache

from memwarden.models import zoo

EXPECT = None

TURNS = 6
NEW_TOKENS = 8


def main() -> None:
    torch.manual_seed(0)
    model = c.qwen2_audio(window_s=8.0, hidden=256, layers=4, ffn=1024, vocab=4096)
    gen = zoo.generate_kwargs("qwen2-audio")
    first = zoo.make_inputs(model, audio_seconds=8.0, prompt_tokens=24)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        history = model.generate(**first, cache=cache, max_new_tokens=NEW_TOKENS, **gen)
        print(f"turn 0: prompt+answer {history.shape[1]} tokens")
        for turn in range(1, TURNS):
            question = c.text_ids(40, 4093, seed=turn)
            history = torch.cat([history, question], dim=1)
            history = model.generate(
                input_ids=history,
                attention_mask=torch.ones_like(history),
                cache=cache,
                max_new_tokens=NEW_TOKENS,
                **gen,
            )
            print(f"turn {turn}: prompt+answer {history.shape[1]} tokens")


if __name__ == "__main__":
    main()
