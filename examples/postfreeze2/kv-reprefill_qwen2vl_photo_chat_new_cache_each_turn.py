"""Multi-turn chat about one photo with Qwen2-VL that starts a fresh KV cache on every turn.

What the user did: built a chat UI on Qwen2-VL where each turn sends the whole conversation, image
included, back through the model. Every turn re-encodes the image from scratch and re-prefills the
full history, "leading to inefficiency in resource constrained environments"; reusing the cached
prefix (past key values) avoids both. vLLM users with several questions about the same image ask the
same thing; transformers.js added PKV-cached multi-turn generation for Qwen-VL for this reason.

Sources:
- https://github.com/LostRuins/koboldcpp/issues/1338 ("for every turn in a multi turn chat environemnt,
  it seems to be re-encoding the image from scratch ... it should just reuse ... the originally created
  embeddings")
- https://github.com/vllm-project/vllm/issues/15132 ("multiround QA when using qwen2.5vl with the same
  input image ... this requires model to processing image each time")
- https://github.com/huggingface/transformers.js/pull/1557 ("Support PKV cached generation for Qwen-VL
  models ... not need to pre-process image inputs or recompute image embeddings")

Reproduction: a tiny random-weight Qwen2-VL (256-wide, 2048-wide MLP), one 336x336 photo (144 merged
visual tokens), 6 turns of a 128-token question (pasted text) and a 24-token answer. ``ask`` builds the turn from the full history and only
sends pixels when the cache it is given is empty -- but it is given a new, empty cache every turn.
"""

import _common as c
import torch
from transformers import DynamicCache

EXPECT = "kv-reprefill"
FIX_WORDS = ("past_key_values", "cache", "reuse", "DynamicCache")


class PhotoChat:
    def __init__(self, model, photo):
        self.model = model
        self.first = c.qwen_inputs(model, images=[photo], prompt_tokens=8, seed=0)
        self.history = self.first["input_ids"][0].tolist()
        self.cache = DynamicCache(config=model.config)

    def _turn_inputs(self, cache):
        ids = torch.tensor([self.history])
        mm = torch.zeros_like(ids, dtype=torch.int)
        mm[ids == self.model.config.image_token_id] = 1
        inputs = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "mm_token_type_ids": mm,
            "image_grid_thw": self.first["image_grid_thw"],
        }
        if cache.get_seq_length() == 0:
            inputs["pixel_values"] = self.first["pixel_values"]
        return inputs

    def ask(self, question_ids, max_new_tokens=24):
        self.history += question_ids
        cache = DynamicCache(config=self.model.config)  # MISTAKE
        inputs = self._turn_inputs(cache)
        out = self.model.generate(
            **inputs,
            past_key_values=cache,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=c.PAD_ID,
            eos_token_id=None,
        )
        answer = out[0, len(self.history) :].tolist()
        self.history += answer
        return answer


def main():
    torch.manual_seed(0)
    model = c.qwen_vl("qwen2-vl", vision_hidden=64, vision_layers=2, hidden=256, ffn=2048, layers=2, vocab=4096)
    chat = PhotoChat(model, c.normalize(c.fake_rgb(336, 336, seed=5)))
    with torch.inference_mode():
        for turn in range(6):
            q = c.text_ids(128, 4092, seed=100 + turn)[0].tolist()
            a = chat.ask(q)
            print(f"turn {turn}: history {len(chat.history)} tokens, answer {len(a)} tokens")


if __name__ == "__main__":
    main()
