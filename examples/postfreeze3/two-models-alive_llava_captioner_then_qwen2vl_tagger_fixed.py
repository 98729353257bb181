"""Fixed twin: the captioner is released (`del captioner`, `gc.collect()`) before the tagger loads.

What the user did: an image-dataset tool first auto-captions a folder with one VLM (a LLaVA-style
captioner) and then loads a second VLM (Qwen2-VL) to produce tags. The captioner is kept in a
module-level variable "for reuse", so when the tagger is loaded both models' weights are resident,
although the captioner is never used again.
Answer in the source: unload the captioning model after auto-captioning (an "unload model after
captioning" option / dropping the node's reference so the memory manager can free it) before the
next model is loaded.
Sources: https://github.com/jhc13/taggui/issues/262 ; https://github.com/chflame163/ComfyUI_LayerStyle/issues/297 ;
https://github.com/StartHua/Comfyui_CXH_joy_caption/issues/20
Reproduction: tiny random-weight LLaVA (~40 MB) captions 4 images, then a Qwen2-VL tagger (~40 MB) is
built and tags the same 4 images after ``del captioner`` and ``gc.collect()``.
"""

import gc

import _common as c
import torch

EXPECT = None


def caption_all(captioner, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        ids = c.llava_prompt(captioner, n_images=1, prompt_tokens=16, seed=i)
        pix = torch.rand(1, 3, 64, 64).sub_(0.5).div_(0.25)
        gen = captioner.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pix, max_new_tokens=8)
        out.append(gen[0, ids.shape[1] :].tolist())
    return out


def tag_all(tagger, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        inputs = c.qwen_inputs(tagger, images=[c.normalize(c.fake_rgb(224, 224, seed=i))], prompt_tokens=16, seed=i)
        gen = tagger.generate(**inputs, max_new_tokens=8, do_sample=False)
        out.append(gen[0, inputs["input_ids"].shape[1] :].tolist())
    return out


def main() -> None:
    with torch.inference_mode():
        captioner = c.llava(image_px=64, patch_px=8, vision_hidden=64, hidden=384, layers=4, vocab=8192)
        captions = caption_all(captioner, 4)
        del captioner
        gc.collect()
        tagger = c.qwen_vl("qwen2-vl", hidden=384, layers=4, vocab=8192, vision_hidden=64)
        tags = tag_all(tagger, 4)
    print("captions:", captions)
    print("tags:", tags)


if __name__ == "__main__":
    main()
