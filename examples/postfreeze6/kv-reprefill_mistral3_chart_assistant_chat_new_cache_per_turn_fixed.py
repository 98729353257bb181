"""A small chart-reading assistant on a Mistral-Small-3.1 style (Pixtral vision) model.

The user uploads one dashboard screenshot, then asks follow-up questions about it.
"""

import torch
from transformers import DynamicCache

import _common as C

EXPECT = None


class ChartChat:
    def __init__(self, model, screenshot):
        self.model = model
        self.vocab_top = model.config.text_config.vocab_size - 3
        first = C.mistral3_inputs(
            model, screenshot, C.tokenize("[INST] You answer questions about this dashboard . [/INST]", self.vocab_top)
        )
        self.pixel_values = first["pixel_values"]
        self.image_sizes = first["image_sizes"]
        self.history = first["input_ids"]
        self.cache = DynamicCache()

    @torch.inference_mode()
    def ask(self, question, max_new_tokens=48):
        turn = torch.tensor([C.tokenize("[INST] " + question + " [/INST]", self.vocab_top)])
        self.history = torch.cat([self.history, turn], dim=1)
        cache = self.cache
        media = {}
        if cache.get_seq_length() == 0:
            media = {"pixel_values": self.pixel_values, "image_sizes": self.image_sizes}
        out = self.model.generate(
            input_ids=self.history,
            attention_mask=torch.ones_like(self.history),
            past_key_values=cache,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            **media,
        )
        self.cache = cache
        reply = out[:, self.history.shape[1] :]
        self.history = out
        return reply


def main():
    torch.manual_seed(0)
    model = C.mistral3(
        patch_px=16,
        merge=2,
        vision_hidden=64,
        vision_layers=2,
        max_image_px=1024,
        hidden=256,
        layers=4,
        vocab=4096,
        ffn=2048,
    )
    shot = C.normalize(C.fake_rgb(384, 512, seed=3))
    chat = ChartChat(model, shot)
    questions = [
        "what is the revenue in march ?",
        "and how does it compare with february ?",
        "which region grew the most ?",
        "summarise the churn panel .",
        "is the forecast line above the target ?",
        "what colour is the alert badge ?",
        "list the three smallest bars .",
        "give me a one line caption for the report .",
    ]
    for q in questions:
        reply = chat.ask(q)
        print(f"Q: {q} -> {reply.shape[1]} tokens (context {chat.history.shape[1]})")


if __name__ == "__main__":
    main()
