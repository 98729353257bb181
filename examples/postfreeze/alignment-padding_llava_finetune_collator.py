"""Fine-tuning a LLaVA-style model (a few training steps) with a data collator that pads every
sample to ``max_length`` (768 tokens) although the samples are 100-190 tokens.

Source: https://github.com/OpenGVLab/InternVL/issues/663
  "internvl的pad方式为将label与input_ids都填充到max_length（在pad_data_collator.py），我想请问这会不会带来
   不必要的内存消耗与导致训练速度变慢呢？" (InternVL pads input_ids and labels to max_length — doesn't
   this waste memory and slow training?) — maintainer: "不padding到最大长度是可以加速的".
See also https://github.com/zhangfaen/finetune-Qwen2-VL/issues/9 (padding "to match the longest of
data sample in the batch").

Every activation saved for backward, the logits and the loss temporaries scale with the padded
length: about 4-5x of them are padding here.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = "alignment-padding"
FIX_WORDS = ("longest", "padding", "max_length", "pad_to_multiple_of", "dynamic")

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
        batch = collate(data[step * BATCH : (step + 1) * BATCH], padding="max_length", max_length=MAX_LENGTH)  # MISTAKE
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step}: width {batch['input_ids'].shape[1]}, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
