"""Serving process that builds a LLaVA model and then ``load_state_dict(torch.load(ckpt))`` into it.

What the user did: the fine-tuned LLaVA checkpoint (a plain ``state_dict`` file) is loaded by
constructing the model with its random initialisation and then calling
``model.load_state_dict(torch.load(path))``. ``torch.load`` materialises a full second copy of every
weight in RAM while the randomly initialised parameters are still there, so host memory peaks at
twice the model size during load.
Answer in the source: load memory-efficiently with ``torch.load(path, mmap=True, weights_only=True)``
and ``load_state_dict(..., assign=True)`` (ideally on a model built on the ``meta`` device), so the
checkpoint's storages are used in place instead of copied.
Sources: https://github.com/pytorch/pytorch/issues/123334 ; https://github.com/rasbt/LLMs-from-scratch/issues/402 ;
https://github.com/Comfy-Org/ComfyUI/pull/11286
Reproduction: a tiny-vocabulary but wide random-weight LLaVA (~190 MB of fp32 weights) is saved as the
"checkpoint" by a separate training process; the serving side rebuilds the model and loads the file with a plain
``torch.load`` + ``load_state_dict``, then answers one request. Host memory (max RSS) is the measure.
"""

import multiprocessing as mp
import os
import tempfile

import _common as c
import torch

EXPECT = "load-spike"
FIX_WORDS = ("mmap", "assign", "meta", "mmap=True")

CFG = dict(image_px=64, patch_px=8, vision_hidden=64, hidden=768, layers=6, vocab=16384, ffn=2048)


def train_and_save(path: str) -> None:
    """The training job (a separate process) that wrote the checkpoint."""
    torch.save(c.llava(seed=1, **CFG).state_dict(), path)


def main() -> None:
    ckpt = os.path.join(tempfile.mkdtemp(), "llava_finetuned.pt")
    job = mp.get_context("spawn").Process(target=train_and_save, args=(ckpt,))
    job.start()
    job.join()

    model = c.llava(seed=0, **CFG)
    model.load_state_dict(torch.load(ckpt, weights_only=True))  # MISTAKE
    ids = c.llava_prompt(model, n_images=1, prompt_tokens=16)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=torch.zeros(1, 3, 64, 64), max_new_tokens=4
        )
    print("params", sum(p.numel() for p in model.parameters()), "answer", out[0, ids.shape[1] :].tolist())
    os.remove(ckpt)


if __name__ == "__main__":
    main()
