"""PaliGemma captioning fine-tune with gradient accumulation done the standard way.

What the user does: small micro-batches padded to their own longest sample, the loss divided by the
number of accumulation steps, ``backward`` every micro-batch, ``optimizer.step()`` / ``zero_grad``
every N micro-batches, and only ``loss.item()`` kept for logging. Peak memory is one micro-batch's
activations plus weights, gradients and AdamW state -- heavy, but what training costs.

Sources:
- https://gist.github.com/thomwolf/ac7a7da6b1888c2eeac8ac8b9b05d3d3 ("loss = loss / accumulation_steps
  ... if (i+1) % accumulation_steps == 0: optimizer.step(); model.zero_grad()")
- https://github.com/pytorch/ignite/issues/583 (gradient accumulation example returning ``loss.item()``)
- https://github.com/huggingface/transformers/pull/46759 (pad each batch to its own longest)

Reproduction: a tiny random-weight PaliGemma (64 image tokens, 8k vocabulary); 6 micro-batches of 2
samples (100-160 tokens), accumulation over 3.
"""

import _common as c
import torch

EXPECT = None

VOCAB, MICRO, ACCUM = 8192, 2, 3


def micro_batches(model, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    n_img, img_tok = model.config.text_config.num_image_tokens, model.config.image_token_id
    for _ in range(n):
        rows, prefixes = [], []
        for _ in range(MICRO):
            q = int(torch.randint(10, 50, (1,), generator=g))
            a = int(torch.randint(20, 40, (1,), generator=g))
            text = torch.randint(c.FIRST_TEXT_ID, VOCAB - 1, (q + a,), generator=g)
            rows.append(
                torch.cat([torch.full((n_img,), img_tok), torch.tensor([c.BOS_ID]), text, torch.tensor([c.EOS_ID])])
            )
            prefixes.append(n_img + 1 + q)
        length = max(len(r) for r in rows)
        ids = torch.full((MICRO, length), c.PAD_ID)
        mask, ttype, labels = torch.zeros_like(ids), torch.zeros_like(ids), torch.full_like(ids, -100)
        for i, (r, p) in enumerate(zip(rows, prefixes, strict=True)):
            ids[i, : len(r)], mask[i, : len(r)] = r, 1
            ttype[i, p : len(r)] = 1
            labels[i, p : len(r)] = r[p:]
        yield {
            "input_ids": ids,
            "attention_mask": mask,
            "token_type_ids": ttype,
            "labels": labels,
            "pixel_values": torch.randn(MICRO, 3, 64, 64, generator=g),
        }


def main():
    torch.manual_seed(0)
    model = c.paligemma(image_px=64, patch_px=8, vision_hidden=64, hidden=128, layers=2, vocab=VOCAB).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    running = 0.0
    for i, batch in enumerate(micro_batches(model, 2 * ACCUM)):
        loss = model(**batch).loss / ACCUM
        loss.backward()
        running += loss.item()
        if (i + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
            print(f"update {(i + 1) // ACCUM}: loss {running:.3f}")
            running = 0.0


if __name__ == "__main__":
    main()
