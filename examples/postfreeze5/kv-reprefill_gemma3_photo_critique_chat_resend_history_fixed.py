import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""A photography-feedback bot on a Gemma 3 style VLM: the user uploads one photo and asks a dozen
follow-up questions. The bot keeps one DynamicCache for the conversation: the photo is encoded and
prefilled in the first turn only, and every later turn prefills just its new question tokens."""

import torch
from transformers import DynamicCache

EXPECT = None

QUESTIONS = [
    "how is the composition",
    "is the horizon level",
    "what about the exposure",
    "are the shadows too crushed",
    "would a crop help",
    "is the subject sharp",
    "what lens was likely used",
    "how would you grade the colours",
    "is there too much noise",
    "what would you change first",
    "is it good enough for a contest",
    "summarise your advice",
]


class PhotoCritic:
    def __init__(self, model, photo):
        self.model = model
        self.photo = photo  # (1, 3, H, W), already normalised
        cfg = model.config
        self.vocab = cfg.text_config.vocab_size
        first = C.gemma3_inputs(model, n_images=1, prompt_tokens=24, seed=1)
        self.history = first["input_ids"][0].tolist()  # BOS, system words, <boi><img>*N<eoi>, intro
        self.cache = DynamicCache(config=model.config.get_text_config())

    def _turn_ids(self, question):
        return [C.FIRST_TEXT_ID] + C.tokenize(question, self.vocab - 3) + [C.FIRST_TEXT_ID + 1]

    def ask(self, question):
        self.history += self._turn_ids(question)
        ids = torch.tensor([self.history])
        inputs = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "token_type_ids": (ids == self.model.config.image_token_id).long(),
        }
        if self.cache.get_seq_length() == 0:
            inputs["pixel_values"] = self.photo
        out = self.model.generate(
            **inputs, past_key_values=self.cache, max_new_tokens=40, min_new_tokens=40, do_sample=False
        )
        answer = out[0, ids.shape[1] :].tolist()
        self.history += answer
        return answer


@torch.no_grad()
def main():
    torch.manual_seed(0)
    model = C.gemma3(image_px=128, patch_px=8, mm_tokens=256, vision_hidden=64, hidden=64, layers=4, vocab=1024)
    photo = C.normalize_float(torch.rand(1, 3, 128, 128))
    bot = PhotoCritic(model, photo)
    for q in QUESTIONS:
        bot.ask(q)
    print("conversation tokens:", len(bot.history))


if __name__ == "__main__":
    main()
