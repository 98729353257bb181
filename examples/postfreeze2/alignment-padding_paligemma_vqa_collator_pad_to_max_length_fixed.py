"""PaliGemma VQA fine-tuning whose collator pads every batch to max_length=512.

FIXED TWIN: the collator pads each batch to its longest sample (padding="longest").

What the user did: fine-tuned a small VLM with a collator that calls the processor with
``padding="max_length", max_length=...``, so every batch is as long as the longest sequence the run
allows, whatever the real lengths. Dynamic padding (pad to the batch's longest) is the default of the
other multimodal processors and of DataCollatorWithPadding; a processor that padded by default was
called "the outlier" because batched calls were padded "up to max_length" and wasted memory.

Sources:
- https://github.com/huggingface/transformers/pull/46759 ("Padding is a batching concern ... pad each
  batch to its own longest, nothing wasted")
- https://github.com/huggingface/trl/pull/5305 (vision preference collator: "the collator [allocated]
  tensors up to N x larger than necessary, ... leading to unexpected OOM errors")
- https://github.com/huggingface/transformers/issues/3634 ("Currenty all input is padded to
  max_seq_length ... [padding] only to the longest sequence in a batch ... will probably save quite
  some memory and time")

Reproduction: a tiny random-weight PaliGemma (64 image tokens, 8k vocabulary), 3 training steps of 4
image/question/answer samples whose real lengths are 100-160 tokens; the collator pads to 512, so the
[4, 512, 8192] logits and every activation are ~3.5x the needed size.
"""

import _common as c
import torch

EXPECT = None

VOCAB, MAX_LENGTH = 8192, 512


def samples(model, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        q = torch.randint(10, 50, (1,), generator=g).item()
        a = torch.randint(20, 40, (1,), generator=g).item()
        yield {
            "pixel_values": torch.randn(3, 64, 64, generator=g),
            "prefix": torch.randint(c.FIRST_TEXT_ID, VOCAB - 1, (q,), generator=g),
            "suffix": torch.randint(c.FIRST_TEXT_ID, VOCAB - 1, (a,), generator=g),
        }


class VQACollator:
    """What PaliGemmaProcessor(text=..., suffix=..., images=...) returns, padded on the right."""

    def __init__(self, model, padding="longest", max_length=None):
        self.n_img = model.config.text_config.num_image_tokens
        self.img_tok = model.config.image_token_id
        self.padding, self.max_length = padding, max_length

    def __call__(self, batch):
        rows = [
            torch.cat(
                [
                    torch.full((self.n_img,), self.img_tok),
                    torch.tensor([c.BOS_ID]),
                    s["prefix"],
                    s["suffix"],
                    torch.tensor([c.EOS_ID]),
                ]
            )
            for s in batch
        ]
        prefix_lens = [self.n_img + 1 + len(s["prefix"]) for s in batch]
        length = self.max_length if self.padding == "max_length" else max(len(r) for r in rows)
        ids = torch.full((len(rows), length), c.PAD_ID)
        mask = torch.zeros_like(ids)
        ttype = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, (r, p) in enumerate(zip(rows, prefix_lens, strict=True)):
            ids[i, : len(r)], mask[i, : len(r)] = r, 1
            ttype[i, p : len(r)] = 1
            labels[i, p : len(r)] = r[p:]
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "token_type_ids": ttype,
            "labels": labels,
            "pixel_values": torch.stack([s["pixel_values"] for s in batch]),
        }


def main():
    torch.manual_seed(0)
    model = c.paligemma(image_px=64, patch_px=8, vision_hidden=64, hidden=128, layers=2, vocab=VOCAB)
    model.train()
    collate = VQACollator(model, padding="longest")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = list(samples(model, 12))
    for step in range(3):
        batch = collate(data[4 * step : 4 * step + 4])
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step}: batch {tuple(batch['input_ids'].shape)}, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
