"""Fixed twin: every micro-batch loss is backpropagated right away; only its float is summed.

What the user did: to fit a larger effective batch, each optimizer step runs 4 micro-batches of
image+caption pairs, but the losses are added into one running tensor and ``backward()`` is called on
the sum after the last micro-batch. Until then the autograd graph of every micro-batch (all the
activations the backward needs) is kept, so the step holds four micro-batches' graphs at once.
Answer in the source: call ``backward()`` for each micro-batch (gradients accumulate in ``.grad``);
separate backward passes free each graph right away, which is what reduces the memory, and the
result is the same as one backward of the summed loss.
Sources: https://github.com/lhoyer/DAFormer/issues/48 ; https://github.com/filipradenovic/cnnimageretrieval-pytorch/issues/20 ;
https://github.com/Shark-NLP/DiffuSeq/issues/49
Reproduction: a tiny random-weight PaliGemma (SigLIP 128 px, 256 image tokens); 2 optimizer steps of
4 micro-batches of 4 samples; each micro-batch calls ``loss.backward()`` and adds ``loss.item()`` to
the logged step loss.
"""

import _common as c
import torch

EXPECT = None

ACCUM = 4


def micro_batch(model, seed: int) -> dict:
    vocab = model.config.text_config.vocab_size
    n_img = (model.config.vision_config.image_size // model.config.vision_config.patch_size) ** 2
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(c.FIRST_TEXT_ID, vocab - 1, (4, 40), generator=g)
    ids = torch.cat([torch.full((4, n_img), model.config.image_token_id), text], 1)
    labels = ids.clone()
    labels[:, : n_img + 8] = -100
    tt = torch.zeros_like(ids)
    tt[:, n_img + 8 :] = 1
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": tt,
        "pixel_values": torch.rand(4, 3, 128, 128, generator=g).sub_(0.5).div_(0.25),
        "labels": labels,
    }


def main() -> None:
    model = c.paligemma(image_px=128, patch_px=8, vision_hidden=64, hidden=128, layers=2, vocab=4096).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    logged = []
    for step in range(2):
        step_loss = 0.0
        for m in range(ACCUM):
            loss = model(**micro_batch(model, seed=10 * step + m)).loss / ACCUM
            loss.backward()
            step_loss += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        logged.append(float(step_loss))
    print("losses:", [round(x, 4) for x in logged])


if __name__ == "__main__":
    main()
