import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""A document-QA worker serves a fine-tuned Llama-3.2-Vision-style (mllama) checkpoint saved as
config.json + model.safetensors. `load_model()` uses from_pretrained on the folder, which builds the
model on the meta device and fills it straight from the (memory-mapped) safetensors file, so only one
copy of the weights is ever resident."""

import torch
import transformers

EXPECT = None

CKPT = dict(image_px=56, patch_px=14, max_tiles=4, vision_hidden=64, hidden=1024, layers=4, vocab=16384, ffn=2048)


def load_model(folder):
    model = transformers.MllamaForConditionalGeneration.from_pretrained(folder)
    return model.eval()


@torch.no_grad()
def main():
    folder = C.saved_checkpoint("mllama", CKPT, "mllama_docqa")
    model = load_model(folder)
    ids = torch.tensor([[C.BOS_ID, 5, 6, 7, 8]])
    out = model(input_ids=ids, logits_to_keep=1).logits
    print("params (M):", round(sum(p.numel() for p in model.parameters()) / 1e6, 1), "next:", int(out[0, -1].argmax()))


if __name__ == "__main__":
    main()
