"""VLM-as-a-judge filtering of synthetic image captions with a Qwen2.5-VL model: for each
(image, caption) pair the prompt ends with "Does the caption match the image? Answer yes or no:"
and the score is P(yes) vs P(no) at the last position.

The judge calls the model without logits_to_keep and then log_softmaxes the whole logits tensor:
full-vocabulary logits (and their log-softmax copy) for every position of every pair, image
tokens included, although only the last position's two entries are used.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = "full-logits"
FIX_WORDS = ["logits_to_keep", "last position", "only the last"]

VOCAB = 32000
YES_ID, NO_ID = 4000, 4001
N_PAIRS = 4


def pair_inputs(model, seed):
    img = C.resize(C.normalize(C.fake_rgb(448, 448, seed=seed)), 448, 448)
    caption = C.text_ids(30, 3000, seed=seed)[0].tolist()
    return C.qwen_inputs(model, images=[img], text_after=caption)


@torch.no_grad()
def judge(model, inputs):
    logits = model(**inputs).logits  # MISTAKE
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    last = logprobs[0, -1]
    return float(last[YES_ID] - last[NO_ID])


def main():
    model = C.qwen_vl(kind="qwen2.5-vl", vision_hidden=64, vision_layers=2, hidden=128, layers=2, vocab=VOCAB)
    scores = [judge(model, pair_inputs(model, i)) for i in range(N_PAIRS)]
    keep = [i for i, s in enumerate(scores) if s > 0]
    print(f"kept {len(keep)} of {N_PAIRS}")


if __name__ == "__main__":
    main()
