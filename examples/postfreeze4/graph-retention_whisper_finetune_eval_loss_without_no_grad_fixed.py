"""Whisper fine-tuning script, evaluation part: after each epoch the user computes the WER-proxy
validation loss over the dev set.

The evaluation loop runs under torch.no_grad() and accumulates Python floats (`loss.item()`), so no
autograd graph is built or kept.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = None
FIX_WORDS = ["no_grad", "item", "inference_mode"]

DEV_BATCHES = 4
BATCH_SIZE = 4
LABEL_LEN = 64


def dev_loader(vocab):
    for b in range(DEV_BATCHES):
        mels = torch.stack([C.log_mel(C.fake_speech(9.0, seed=100 * b + i), frames=1000) for i in range(BATCH_SIZE)])
        labels = C.text_ids(BATCH_SIZE * LABEL_LEN, vocab - 1, seed=b).view(BATCH_SIZE, LABEL_LEN)
        yield {"input_features": mels, "labels": labels}


@torch.no_grad()
def evaluate(model):
    model.eval()
    total_loss, n = 0.0, 0
    for batch in dev_loader(model.config.vocab_size):
        out = model(**batch)
        total_loss += out.loss.item()
        n += 1
    return total_loss / n


def main():
    model = C.whisper(d_model=256, layers=4, vocab=4096, window_s=10.0)
    model.train()  # the fine-tuning loop left it in train mode; parameters require grad
    val = evaluate(model)
    print(f"dev loss {float(val):.3f}")


if __name__ == "__main__":
    main()
