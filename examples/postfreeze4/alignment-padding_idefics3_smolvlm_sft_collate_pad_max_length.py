"""SmolVLM (Idefics3-style) supervised fine-tune on short screenshot-QA samples.

The user's collator pads every batch to the processor's max_length (2048) although the longest
sample in the data is ~200 tokens, so every forward/backward runs (and keeps activations and
logits) over ten times more positions than the data has.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = "alignment-padding"
FIX_WORDS = ["longest", "pad to the longest", "max_length"]

CONFIG = {
    "max_length": 2048,
    "batch_size": 4,
    "steps": 2,
    "lr": 1e-4,
    "image_px": 64,
}


class ScreenshotQADataset:
    """Each sample: one small screenshot + a question and a short answer (50-150 text tokens)."""

    def __init__(self, n, vocab_top, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.samples = []
        for _i in range(n):
            n_text = int(torch.randint(50, 150, (1,), generator=g))
            words = torch.randint(C.FIRST_TEXT_ID, vocab_top, (n_text,), generator=g).tolist()
            img = torch.rand(3, CONFIG["image_px"], CONFIG["image_px"], generator=g)
            self.samples.append({"words": words, "image": img})

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def make_collate(model):
    block = C.idefics3_image_block(model)

    def collate_fn(examples):
        rows = [[C.BOS_ID] + block + ex["words"] for ex in examples]
        target_len = CONFIG["max_length"]  # MISTAKE
        input_ids = torch.full((len(rows), target_len), C.PAD_ID, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = torch.tensor(r)
            attention_mask[i, : len(r)] = 1
        labels = input_ids.clone()
        labels[attention_mask == 0] = -100
        labels[input_ids >= model.config.image_token_id - 2] = -100
        pixel_values = torch.stack([C.normalize_float(ex["image"]) for ex in examples]).unsqueeze(1)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "pixel_values": pixel_values,
            "pixel_attention_mask": torch.ones(len(rows), 1, *pixel_values.shape[-2:], dtype=torch.bool),
        }

    return collate_fn


def train(model, loader, optimizer):
    model.train()
    for step, batch in enumerate(loader):
        out = model(**batch)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step} loss {out.loss.item():.3f} seq {batch['input_ids'].shape[1]}")
        if step + 1 >= CONFIG["steps"]:
            break


def main():
    torch.manual_seed(0)
    model = C.idefics3(image_px=CONFIG["image_px"], patch_px=8, scale=2, hidden=64, vocab=2048)
    ds = ScreenshotQADataset(CONFIG["batch_size"] * CONFIG["steps"], 2048 - 3)
    loader = torch.utils.data.DataLoader(ds, batch_size=CONFIG["batch_size"], collate_fn=make_collate(model))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=CONFIG["lr"])
    train(model, loader, optimizer)


if __name__ == "__main__":
    main()
