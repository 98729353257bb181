"""An InstructBLIP worker for a visual-instruction API (our fine-tuned checkpoint, exported in fp16).
The loader was written for CPU debugging in float32; in production the worker serves in half precision."""

import torch
from transformers import InstructBlipForConditionalGeneration

import _common as C

EXPECT = "load-spike"
FIX_WORDS = ["dtype", "float16", "from_pretrained", "torch_dtype", "load directly"]

CKPT = C.saved_pretrained(
    "blip2",
    {
        "kind": "instructblip",
        "image_px": 96,
        "patch_px": 8,
        "vision_hidden": 256,
        "queries": 32,
        "hidden": 512,
        "layers": 8,
        "vocab": 32000,
        "ffn": 1536,
    },
    "instructblip_vqa_fp16",
    cast="float16",
)


def load_worker():
    model = InstructBlipForConditionalGeneration.from_pretrained(CKPT, dtype=torch.float32).half()  # MISTAKE
    return model.eval()


@torch.no_grad()
def answer(model, image, instruction):
    vocab_top = model.config.text_config.vocab_size - 2
    words = C.tokenize(instruction, vocab_top)
    ids = torch.tensor([C.blip2_prompt(model, words)])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        qformer_input_ids=torch.tensor([[C.FIRST_TEXT_ID + (w % 1000) for w in words]]),
        pixel_values=image.unsqueeze(0).to(model.dtype),
        max_new_tokens=8,
        do_sample=False,
    )
    return out[0, ids.shape[1] :]


def main():
    model = load_worker()
    image = C.normalize(C.fake_rgb(96, 96, seed=0))
    reply = answer(model, image, "Describe the damage on this parcel in one sentence .")
    print(
        f"loaded {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params as {model.dtype}; reply {reply.shape[0]} tokens"
    )


if __name__ == "__main__":
    main()
