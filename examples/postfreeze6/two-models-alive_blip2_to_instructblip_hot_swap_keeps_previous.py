"""A captioning microservice that can hot-swap its model (admin endpoint): it starts on BLIP-2 and
is switched to InstructBLIP when the instruction-following feature is turned on."""

import gc

import torch

import _common as C

EXPECT = "two-models-alive"
FIX_WORDS = ["del", "previous", "release", "gc.collect", "before loading"]

SPECS = {
    "blip2-opt": dict(
        kind="blip2", image_px=96, patch_px=8, vision_hidden=256, hidden=512, layers=6, vocab=16384, ffn=1536
    ),
    "instructblip-llama": dict(
        kind="instructblip", image_px=96, patch_px=8, vision_hidden=256, hidden=512, layers=6, vocab=16384, ffn=1536
    ),
}


class CaptionService:
    def __init__(self, name):
        self.name = name
        self.previous = None
        self.model = C.blip2(**SPECS[name])

    def swap(self, name):
        self.previous = self.model  # MISTAKE
        gc.collect()
        self.model = C.blip2(**SPECS[name], seed=1)
        self.name = name

    @torch.no_grad()
    def caption(self, rgb, prompt="a photo of"):
        vocab_top = self.model.config.text_config.vocab_size - 2
        words = C.tokenize(prompt, vocab_top)
        ids = torch.tensor([C.blip2_prompt(self.model, words)])
        kw = {}
        if SPECS[self.name]["kind"] == "instructblip":
            kw["qformer_input_ids"] = torch.tensor([[C.FIRST_TEXT_ID + w % 1000 for w in words]])
        out = self.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=C.resize(C.normalize(rgb), 96, 96).unsqueeze(0),
            max_new_tokens=10,
            do_sample=False,
            **kw,
        )
        return out[0, ids.shape[1] :]


def main():
    svc = CaptionService("blip2-opt")
    for i in range(2):
        print(svc.name, svc.caption(C.fake_rgb(200, 300, seed=i)).shape[0], "tokens")
    svc.swap("instructblip-llama")
    for i in range(2):
        print(
            svc.name, svc.caption(C.fake_rgb(200, 300, seed=10 + i), "describe the scene in detail").shape[0], "tokens"
        )


if __name__ == "__main__":
    main()
