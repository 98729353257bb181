import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""SNLI-VE-style visual entailment eval of a Llama-3.2-Vision-style (mllama) model: each example is an
image plus a hypothesis, and the prediction is whichever of the three label words ("yes", "maybe",
"no") has the highest logit at the last prompt position. The eval step calls the model without
logits_to_keep, so every batch materialises (batch, prompt_len, vocab) logits to read one row."""

import torch

EXPECT = "full-logits"
FIX_WORDS = ("logits_to_keep", "last position", "last token")

TILE, MAX_TILES = 56, 4


class EntailmentSet(torch.utils.data.Dataset):
    def __init__(self, model, n=32):
        self.cfg = model.config
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, 100, 100, generator=g)
        pv, ar_ids, ar_mask, n_tiles = C.mllama_tiles(img, TILE, MAX_TILES)
        vocab = self.cfg.text_config.vocab_size
        hyp = torch.randint(C.FIRST_TEXT_ID, vocab - 1, (96,), generator=g).tolist()
        ids = [C.BOS_ID, self.cfg.image_token_id] + hyp
        return {"ids": ids, "pv": pv[0], "ar_ids": ar_ids[0], "ar_mask": ar_mask[0], "n_tiles": n_tiles, "label": i % 3}


def collate(items):
    ids = torch.tensor([it["ids"] for it in items])
    cross = torch.zeros(len(items), ids.shape[1], 1, MAX_TILES, dtype=torch.long)
    for b, it in enumerate(items):
        cross[b, 1:, 0, : it["n_tiles"]] = 1
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": torch.stack([it["pv"] for it in items]),
        "aspect_ratio_ids": torch.stack([it["ar_ids"] for it in items]),
        "aspect_ratio_mask": torch.stack([it["ar_mask"] for it in items]),
        "cross_attention_mask": cross,
    }, torch.tensor([it["label"] for it in items])


@torch.no_grad()
def evaluate(model, loader, label_ids):
    correct = total = 0
    for batch, labels in loader:
        logits = model(**batch).logits  # MISTAKE
        pred = logits[:, -1, label_ids].argmax(-1)
        correct += int((pred == labels).sum())
        total += len(labels)
    return correct / total


def main():
    torch.manual_seed(0)
    model = C.mllama(
        image_px=TILE, patch_px=14, max_tiles=MAX_TILES, vision_hidden=32, hidden=64, layers=2, vocab=32768
    )
    loader = torch.utils.data.DataLoader(EntailmentSet(model), batch_size=8, collate_fn=collate)
    label_ids = [C.FIRST_TEXT_ID + 1, C.FIRST_TEXT_ID + 2, C.FIRST_TEXT_ID + 3]  # "yes", "maybe", "no"
    print("accuracy:", round(evaluate(model, loader, label_ids), 3))


if __name__ == "__main__":
    main()
