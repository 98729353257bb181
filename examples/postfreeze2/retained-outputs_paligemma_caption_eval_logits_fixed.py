"""Hand-written evaluation loop for a PaliGemma captioner that stores every batch's logits for metrics.

FIXED TWIN: the logits are reduced to argmax ids per batch before being stored (preprocess_logits_for_metrics).

What the user did: evaluated a fine-tuned model with a metric computed at the end, collecting the
model's logits for every evaluation batch (what ``Trainer`` does by default when compute_metrics is
set). The stored predictions are [eval set, sequence length, vocab size] and run out of memory; the
fix adopted in transformers is to reduce the logits per batch before storing them
(``preprocess_logits_for_metrics``, e.g. ``logits.argmax(dim=-1)``).

Sources:
- https://github.com/huggingface/transformers/issues/12878 ("Trainer accumulates logits ... 1000 examples
  with max_length = 512 and vocab_size = 30522 occupy ... > 14 Gb of memory")
- https://github.com/huggingface/transformers/issues/15466 ("In many cases, what is needed to compute
  metrics is just some reduction of the logits. For example: logits.argmax(dim=-1).")

Reproduction: a tiny random-weight PaliGemma (64 image tokens, 8k vocabulary), 12 eval batches of 4
image+caption pairs (~100 tokens each), teacher-forced under no_grad. Token accuracy is computed at
the end from the stored predictions.
"""

import _common as c
import torch

EXPECT = None

VOCAB, BATCH, N_BATCHES, CAPTION = 8192, 4, 12, 36


def eval_batches(model, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    img_tok = model.config.image_token_id
    n_img = model.config.text_config.num_image_tokens
    for _ in range(n):
        text = torch.randint(c.FIRST_TEXT_ID, VOCAB - 1, (BATCH, CAPTION), generator=g)
        ids = torch.cat([torch.full((BATCH, n_img), img_tok), torch.full((BATCH, 1), c.BOS_ID), text], dim=1)
        labels = ids.clone()
        labels[:, : n_img + 1] = -100
        yield {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.cat(
                [torch.zeros(BATCH, n_img + 1 + 8, dtype=torch.long), torch.ones(BATCH, CAPTION - 8, dtype=torch.long)],
                dim=1,
            ),
            "pixel_values": torch.randn(BATCH, 3, 64, 64, generator=g),
            "labels": labels,
        }


def token_accuracy(preds, labels):
    hits = total = 0
    for p, lab in zip(preds, labels, strict=True):
        p = p.argmax(-1) if p.dim() == 3 else p
        mask = lab[:, 1:] != -100
        hits += (p[:, :-1][mask] == lab[:, 1:][mask]).sum().item()
        total += mask.sum().item()
    return hits / total


def main():
    torch.manual_seed(0)
    model = c.paligemma(image_px=64, patch_px=8, vision_hidden=64, hidden=128, layers=2, vocab=VOCAB)
    preds, labels, losses = [], [], []
    with torch.no_grad():
        for batch in eval_batches(model, N_BATCHES):
            out = model(**batch)
            losses.append(out.loss.item())
            preds.append(out.logits.argmax(dim=-1))
            labels.append(batch["labels"])
    print(f"eval loss {sum(losses) / len(losses):.3f}, token accuracy {token_accuracy(preds, labels):.4f}")


if __name__ == "__main__":
    main()
