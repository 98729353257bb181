"""Fine-tuning Qwen2-Audio on spoken commands; the validation loop sums loss tensors, not numbers.

What the user did: a fine-tuning script whose validation pass runs the model in eval mode and keeps a
running total with ``val_loss += loss``. Because the forward runs with autograd on and the running
total is a tensor, every validation batch's graph (with all its saved activations) stays reachable
from the total until the epoch ends, and memory climbs batch after batch. The advice in these threads:
accumulate ``loss.item()`` (and run validation under ``torch.no_grad()``).

Sources:
- https://github.com/spro/practical-pytorch/pull/29 ("one should not keep adding the loss to itself as
  it creates a Variable each time. I have seen out of memory issues while doing that"), pointing to
  https://discuss.pytorch.org/t/cuda-memory-continuously-increases-when-net-images-called-in-every-iteration/501
- https://github.com/hszhao/semseg/issues/60 ('"out of memory" during validation ... You should add
  "with torch.no_grad():" before "output = model(input)"')
- https://github.com/OpenNMT/OpenNMT-py/issues/1141 ("torch.no_grad() in validate ?")

Reproduction: a tiny random-weight Qwen2-Audio (6 s mel window -> 75 audio tokens), two training
steps, then validation over 5 batches of 4 clips with a 24-token transcript each.
"""

import _common as c
import torch

EXPECT = "graph-retention"
FIX_WORDS = ("item", "no_grad", "detach", "inference_mode")

WINDOW_S, BATCH, TEXT = 6.0, 4, 24


def make_batch(model, seed):
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    frames = int(WINDOW_S * 100)
    n_audio = ((frames - 1) // 2 + 1 - 2) // 2 + 1
    vocab = cfg.text_config.vocab_size
    text = torch.randint(c.FIRST_TEXT_ID, vocab - 3, (BATCH, TEXT), generator=g)
    audio = torch.full((BATCH, n_audio), cfg.audio_token_id)
    ids = torch.cat(
        [torch.full((BATCH, 1), cfg.audio_token_id - 2), audio, torch.full((BATCH, 1), cfg.audio_token_id - 1), text],
        dim=1,
    )
    labels = ids.clone()
    labels[:, : n_audio + 2] = -100
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "input_features": torch.randn(BATCH, 128, frames, generator=g),
        "feature_attention_mask": torch.ones(BATCH, frames, dtype=torch.long),
        "labels": labels,
    }


def train_step(model, opt, batch):
    model.train()
    loss = model(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def validate(model, batches):
    model.eval()
    val_loss = 0.0
    for batch in batches:
        loss = model(**batch).loss
        val_loss += loss  # MISTAKE
    return float(val_loss) / len(batches)


def main():
    torch.manual_seed(0)
    model = c.qwen2_audio(window_s=WINDOW_S, audio_hidden=64, audio_layers=2, hidden=128, layers=2, vocab=4096)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(2):
        print(f"train step {step}: loss {train_step(model, opt, make_batch(model, step)):.3f}")
    val = [make_batch(model, 100 + i) for i in range(5)]
    print(f"validation loss {validate(model, val):.3f}")


if __name__ == "__main__":
    main()
