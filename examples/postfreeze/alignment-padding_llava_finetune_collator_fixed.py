"""Fixed twin of alignment-padding_llava_finetune_collator: the collator pads each batch to its
longest sample, so activations, logits and loss temporaries cover real tokens only.

Source: https://github.com/OpenGVLab/InternVL/issues/663 (padding input_ids and labels to
max_length: "不padding到最大长度是可以加速的").
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None

MAX_LENGTH = 768
BATCH, STEPS = 4, 3


def collate(samples: list[dict], padding: str = "longest", max_length: int | None = None) -> dict:
    """Right-pad input_ids (PAD) and labels (-100) like ``tokenizer.pad`` with the same arguments."""
    longest = max(len(s["input_ids"]) for s in samples)
    width = max_length if padding == "max_length" else longest
    ids = torch.full((len(samples), width), zoo.PAD_ID)
    labels = torch.full((len(samples), width), -100)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = s["input_ids"], s["labels"], 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": labels,
        "pixel_values": torch.cat([s["pixel_values"] for s in samples]),
    }


def dataset(model, n: int) -> list[dict]:
    out = []
    for i in range(n):
        r = zoo.make_inputs(model, prompt_tokens=40 + (37 * i) % 90, seed=i)
        ids = r["input_ids"][0]
        labels = ids.clone()
        labels[ids == model.config.image_token_id] = -100
        out.append({"input_ids": ids, "labels": labels, "pixel_values": r["pixel_values"]})
    return out


def main() -> None:
    torch.manual_seed(0)
    model = c.llava(image_px=112, patch_px=14, hidden=64, layers=2, vocab=2048).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = dataset(model, BATCH * STEPS)
    for step in range(STEPS):
        batch = collate(data[step * BATCH : (step + 1) * BATCH], padding="longest")
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step}: width {batch['input_ids'].shape[1]}, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
