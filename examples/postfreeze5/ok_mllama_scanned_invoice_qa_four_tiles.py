import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""Invoice question answering with a Llama-3.2-Vision-style (mllama) model: each scanned A4 invoice is
tiled by the processor into the model's maximum of 4 tiles (the documented max_image_tiles), and a
handful of field questions are answered with greedy generation under no_grad."""

import torch

EXPECT = None

TILE, MAX_TILES = 112, 4
QUESTIONS = ["what is the invoice number", "what is the total amount", "who is the supplier", "what is the due date"]


def ask(model, tiles, question):
    pv, ar_ids, ar_mask, n = tiles
    cfg = model.config
    words = C.tokenize(question, cfg.text_config.vocab_size - 1)
    ids = torch.tensor([[C.BOS_ID, cfg.image_token_id] + words])
    cross = torch.zeros(1, ids.shape[1], 1, MAX_TILES, dtype=torch.long)
    cross[:, 1:, 0, :n] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        pixel_values=pv,
        aspect_ratio_ids=ar_ids,
        aspect_ratio_mask=ar_mask,
        cross_attention_mask=cross,
        max_new_tokens=12,
        do_sample=False,
    )
    return out[0, ids.shape[1] :].tolist()


@torch.no_grad()
def main():
    torch.manual_seed(0)
    model = C.mllama(
        image_px=TILE, patch_px=14, max_tiles=MAX_TILES, vision_hidden=64, hidden=128, layers=4, vocab=4096
    )
    answers = []
    for inv in range(3):
        page = torch.rand(3, 220, 160)  # a scanned A4 page, portrait
        tiles = C.mllama_tiles(page, TILE, MAX_TILES)
        answers += [ask(model, tiles, q) for q in QUESTIONS]
    print("answers:", len(answers), "tiles per page:", tiles[3])


if __name__ == "__main__":
    main()
