"""Zero-shot PCB defect screening with an InternVL-style chat model: each board photo is tiled,
asked "Is there a soldering defect? Answer yes or no." and scored by P(yes) vs P(no) at the last
position of the prompt."""

import torch

import _common as C

EXPECT = None

TILE = 64
MAX_TILES = 6
BATCH = 4


def build_request(model, rgb, question_ids):
    tiles = C.internvl_tiles(C.normalize(rgb), TILE, MAX_TILES)
    n = tiles.shape[0] * C.internvl_tokens_per_tile(model)
    ids = [C.BOS_ID] + [model.config.image_token_id] * n + question_ids
    return tiles, ids


@torch.no_grad()
def score_boards(model, boards, yes_id, no_id, question_ids):
    reqs = [build_request(model, b, question_ids) for b in boards]
    T = max(len(ids) for _, ids in reqs)
    ids = torch.full((len(reqs), T), C.PAD_ID)
    att = torch.zeros(len(reqs), T, dtype=torch.long)
    for i, (_, r) in enumerate(reqs):
        ids[i, T - len(r) :] = torch.tensor(r)
        att[i, T - len(r) :] = 1
    pixel_values = torch.cat([t for t, _ in reqs])
    out = model(input_ids=ids, attention_mask=att, pixel_values=pixel_values, logits_to_keep=1)
    last = out.logits[:, -1, [yes_id, no_id]].float()
    return last.softmax(-1)[:, 0]


def main():
    torch.manual_seed(0)
    model = C.internvl(image_px=TILE, patch_px=8, vision_hidden=64, hidden=128, layers=2, vocab=32000)
    vocab_top = model.config.text_config.vocab_size - 1
    question = C.tokenize("Is there a soldering defect on this board ? Answer yes or no .", vocab_top)
    yes_id, no_id = C.tokenize("yes no", vocab_top)
    boards = [C.fake_rgb(480, 720, seed=s) for s in range(8)]
    for i in range(0, len(boards), BATCH):
        p_yes = score_boards(model, boards[i : i + BATCH], yes_id, no_id, question)
        print(f"boards {i}-{i + BATCH - 1}: P(defect) = {[round(p, 3) for p in p_yes.tolist()]}")


if __name__ == "__main__":
    main()
