"""Answering a fixed list of questions about each chart with a Qwen2-VL model.

The chart is encoded and prefilled once as a shared prefix; each question continues from a copy
of that prefix cache, so the image exists once in the vision tower and once per live cache copy.
"""

import copy
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch
from transformers import DynamicCache

EXPECT = None
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
    prefix = C.qwen_inputs(model, images=[img], text_after=[], prompt_tokens=8)
    prefix_cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(**prefix, past_key_values=prefix_cache, use_cache=True)  # encode the image once
    answers = []
    for q in QUESTIONS:
        cache = copy.deepcopy(prefix_cache)  # copy the prefix cache per question
        q_ids = torch.tensor([C.tokenize(q, vocab_top)])
        answers.append(greedy(model, C.qwen_turn(model, q_ids), cache, MAX_NEW))
    return torch.cat(answers)


def main():
    model = C.qwen_vl(kind="qwen2-vl", vision_hidden=64, vision_layers=2, hidden=128, layers=2, vocab=4096)
    answers = answer_all(model, chart())
    print(answers.shape)


if __name__ == "__main__":
    main()
