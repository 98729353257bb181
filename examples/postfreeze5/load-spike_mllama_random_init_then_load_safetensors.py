import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""A document-QA worker serves a fine-tuned Llama-3.2-Vision-style (mllama) checkpoint saved as
config.json + model.safetensors. `load_model()` instantiates the architecture from the config (random
fp32 weights, fully initialised), then reads the whole safetensors file into a state dict and copies it
in with load_state_dict, so two complete copies of the weights are resident during start-up."""

import safetensors.torch
import torch
import transformers

EXPECT = "load-spike"
FIX_WORDS = ("meta", "assign=true", "from_pretrained", "mmap", "low_cpu_mem_usage")

CKPT = dict(image_px=56, patch_px=14, max_tiles=4, vision_hidden=64, hidden=1024, layers=4, vocab=16384, ffn=2048)


def load_model(folder):
    cfg = transformers.MllamaConfig.from_pretrained(folder)
    model = transformers.MllamaForConditionalGeneration._from_config(cfg)  # MISTAKE
    state = safetensors.torch.load_file(folder + "/model.safetensors")
    model.load_state_dict(state, strict=False)
    del state
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
