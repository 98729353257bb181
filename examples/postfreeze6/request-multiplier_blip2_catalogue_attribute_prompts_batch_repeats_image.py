"""Catalogue enrichment with BLIP-2 (OPT): for every product photo we ask a fixed list of attribute
questions (colour, material, pattern, ...) and store the short answers."""

import torch

import _common as C

EXPECT = "request-multiplier"
FIX_WORDS = ["repeat", "batch", "once", "image embeddings", "per question"]

QUESTIONS = [
    "Question: what colour is the product ? Answer:",
    "Question: what material is it made of ? Answer:",
    "Question: does it have a pattern ? Answer:",
    "Question: is there a logo ? Answer:",
    "Question: what kind of product is this ? Answer:",
    "Question: is it for men , women or kids ? Answer:",
    "Question: what season is it for ? Answer:",
    "Question: how many items are shown ? Answer:",
]
QUESTIONS_PER_CALL = len(QUESTIONS)  # MISTAKE


@torch.no_grad()
def enrich(model, rgb):
    vocab_top = model.config.text_config.vocab_size - 2
    pix = C.resize(C.normalize(rgb), 224, 224).unsqueeze(0)
    answers = {}
    for start in range(0, len(QUESTIONS), QUESTIONS_PER_CALL):
        chunk = QUESTIONS[start : start + QUESTIONS_PER_CALL]
        rows = [C.blip2_prompt(model, C.tokenize(q, vocab_top)) for q in chunk]
        T = max(len(r) for r in rows)
        ids = torch.full((len(rows), T), C.PAD_ID)
        att = torch.zeros(len(rows), T, dtype=torch.long)
        for i, r in enumerate(rows):  # left padding for generation
            ids[i, T - len(r) :] = torch.tensor(r)
            att[i, T - len(r) :] = 1
        out = model.generate(
            input_ids=ids,
            attention_mask=att,
            pixel_values=pix.expand(len(rows), -1, -1, -1),
            max_new_tokens=6,
            do_sample=False,
        )
        for q, o in zip(chunk, out):
            answers[q] = o[T:].tolist()
    return answers


def main():
    torch.manual_seed(0)
    model = C.blip2(image_px=224, patch_px=8, vision_hidden=128, queries=32, hidden=128, layers=2, vocab=2048)
    for sku in range(2):
        answers = enrich(model, C.fake_rgb(600, 600, seed=sku))
        print(f"sku {sku}: {len(answers)} attributes")


if __name__ == "__main__":
    main()
