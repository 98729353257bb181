"""Multiple-choice VQA evaluation (A/B/C/D) of a LLaVA model, the way many eval scripts score it:
one forward over image + question + options, then compare the logits of the letters " A".." D" at
the last position.

The forward returns logits for every position of the batch (image tokens included) over the full
vocabulary, although only the last position's four letter logits are read.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = "full-logits"
FIX_WORDS = ["logits_to_keep", "last position", "hidden state"]

BATCH = 8
VOCAB = 32000
LETTER_IDS = [VOCAB - 10, VOCAB - 9, VOCAB - 8, VOCAB - 7]


def eval_batches(model, n_batches=2):
    for b in range(n_batches):
        ids = torch.cat([C.llava_prompt(model, n_images=1, prompt_tokens=40, seed=b * BATCH + i) for i in range(BATCH)])
        pix = C.normalize(
            torch.stack([torch.as_tensor(C.fake_rgb(112, 112, seed=b * BATCH + i)) for i in range(BATCH)]).numpy()
        )
        answers = torch.randint(0, 4, (BATCH,), generator=torch.Generator().manual_seed(b))
        yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pix}, answers


@torch.no_grad()
def score(model, batch):
    logits = model(**batch).logits  # MISTAKE
    letter_logits = logits[:, -1, LETTER_IDS]
    return letter_logits.argmax(-1)


def main():
    model = C.llava(image_px=112, patch_px=8, vision_hidden=64, vision_layers=2, hidden=128, layers=2, vocab=VOCAB)
    correct = total = 0
    for batch, answers in eval_batches(model):
        pred = score(model, batch)
        correct += int((pred == answers).sum())
        total += len(answers)
    print(f"accuracy {correct / total:.3f} on {total}")


if __name__ == "__main__":
    main()
