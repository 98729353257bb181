"""Reading a dense document page with Qwen2.5-VL at the model card's upper visual-token budget.

What the user does: follows the Qwen2-VL / Qwen2.5-VL model card, which says the default range of
visual tokens per image is 4-16384 and suggests setting ``min_pixels`` / ``max_pixels`` "such as a
token count range of 256-1280, to balance speed and memory usage". A dense invoice needs the upper
end of that range to keep small print legible, so the page is resized to ~1280 merged tokens -- a
large but deliberate and bounded request.

Sources:
- https://huggingface.co/spaces/ramprasady-m/rag_ColPali_Qwen2VL_7B/commit/a4c6545e7b63841519c9f7825fcdcc147ec623d4
  (the model card's processor comment: "min_pixels = 256*28*28 ... token count range of 256-1280, to
  balance speed and memory usage")
- https://huggingface.co/Qwen/Qwen2-VL-2B/blob/258ddfbb32d06e19760700c3e472c248e164119c/preprocessor_config.json
  (processor defaults: min_pixels 3136, max_pixels 12845056)

Reproduction: a tiny random-weight Qwen2.5-VL; a 2200x1700 px scan resized with
``max_pixels=1280*28*28`` (1240 merged tokens), one extraction prompt, 32 new tokens.
"""

import _common as c
import torch

EXPECT = None

MIN_PIXELS, MAX_PIXELS = 256 * 28 * 28, 1280 * 28 * 28


def main():
    torch.manual_seed(0)
    model = c.qwen_vl("qwen2.5-vl", vision_hidden=64, vision_layers=2, hidden=128, layers=2, vocab=4096)
    scan = c.fake_rgb(2200, 1700, seed=3)
    h, w = c.smart_resize(*scan.shape[:2], min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    page = c.normalize(c.pil_resize(scan, h, w))
    inputs = c.qwen_inputs(model, images=[page], prompt_tokens=48, seed=8)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=32, do_sample=False, pad_token_id=c.PAD_ID, eos_token_id=None)
    print(
        f"page {w}x{h} -> {(h // 28) * (w // 28)} visual tokens; answer {out.shape[1] - inputs['input_ids'].shape[1]} tokens"
    )


if __name__ == "__main__":
    main()
