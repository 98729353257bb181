"""Answering a fixed list of questions about each chart with a Qwen2-VL model.

To "use the batch", the script builds one row per question, each row a full user turn with the
chart image: the same image is patchified, encoded by the vision tower and prefilled once per
question (6x), and all six copies of the image tokens sit in the KV cache together.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch
from transformers import DynamicCache

EXPECT = "request-multiplier"
FIX_WORDS = ["encode the image once", "prefix cache", "copy the cache"]

QUESTIONS = ["chart title", "x axis", "y axis", "max value", "min value", "overall trend"]
MAX_NEW = 6


def chart():
    return C.resize(C.normalize(C.fake_rgb(560, 560, seed=3)), 560, 560)


@torch.no_grad()
def greedy(model, inputs, cache, steps):
    out = model(**inputs, past_key_values=cache, use_cache=True)
    tok = out.logits[:, -1:].argmax(-1)
    toks = [tok]
    for _ in range(steps - 1):
        out = model(**C.qwen_turn(model, tok), past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        toks.append(tok)
    return torch.cat(toks, dim=1)


def answer_all(model, img):
    vocab_top = model.config.get_text_config().vocab_size - 4
    rows = [C.qwen_inputs(model, images=[img], text_after=C.tokenize(q, vocab_top), prompt_tokens=8) for q in QUESTIONS]
    batch = {k: torch.cat([r[k] for r in rows]) for k in rows[0]}  # MISTAKE
    return greedy(model, batch, DynamicCache(config=model.config), MAX_NEW)


def main():
    model = C.qwen_vl(kind="qwen2-vl", vision_hidden=64, vision_layers=2, hidden=128, layers=2, vocab=4096)
    answers = answer_all(model, chart())
    print(answers.shape)


if __name__ == "__main__":
    main()
