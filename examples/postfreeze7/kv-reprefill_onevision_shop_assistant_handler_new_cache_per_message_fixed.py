"""Product-photo shopping assistant (Gradio-style chat handler) on LLaVA-OneVision.

The handler keeps the conversation's token ids and a KV cache on a session object, and sends the
photo's pixels only while the cache is empty. But it starts every message with a fresh
DynamicCache (a leftover from debugging a cache-length error), so each new question re-encodes the
anyres photo (9 crops + base) and prefills the whole, growing conversation again.
"""

import torch
from transformers import DynamicCache

import _common as C

EXPECT = None

model = C.onevision(image_px=32, patch_px=4, vision_hidden=64, hidden=128, layers=2, ffn=4096, vocab=4096)
processor = C.onevision_image_processor(model)
vocab = model.config.text_config.vocab_size


class ChatSession:
    def __init__(self, photo):
        enc = processor(images=[photo], return_tensors="pt")
        self.pixel_values, self.image_sizes = enc["pixel_values"], enc["image_sizes"]
        n = C.onevision_placeholders(model, self.pixel_values, self.image_sizes)[0]
        self.ids = torch.tensor([[C.BOS_ID] + [model.config.image_token_id] * n])
        self.cache = None

    @torch.no_grad()
    def respond(self, message: str) -> list[int]:
        if self.cache is None:
            self.cache = DynamicCache()
        turn = torch.tensor([C.tokenize("<|im_start|>user " + message + " <|im_end|><|im_start|>assistant", vocab - 2)])
        ids = torch.cat([self.ids, turn], dim=1)
        extra = {}
        if self.cache.get_seq_length() == 0:
            extra = {"pixel_values": self.pixel_values, "image_sizes": self.image_sizes}
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            past_key_values=self.cache,
            max_new_tokens=40,
            do_sample=False,
            **extra,
        )
        self.ids = out
        return out[0, ids.shape[1] :].tolist()


if __name__ == "__main__":
    session = ChatSession(C.fake_rgb(96, 96, seed=7))
    questions = [
        "What is this product and what is it made of?",
        "Is it suitable for outdoor use in the rain?",
        "Which colours does the photo show?",
        "Write a short listing title for it.",
        "Now a two sentence description for the listing page please.",
        "Suggest three search keywords.",
        "Translate the title into German.",
        "What size is it likely to be?",
    ]
    for q in questions:
        reply = session.respond(q)
    print("conversation tokens:", session.ids.shape[1], "cache:", session.cache.get_seq_length())
