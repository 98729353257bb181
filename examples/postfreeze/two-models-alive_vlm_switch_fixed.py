"""Fixed twin of two-models-alive_vlm_switch: the app drops its reference to the old model (and
collects) before the new one is built, so only one model's weights are alive at a time.

Source: https://github.com/Sanster/IOPaint/pull/165 — "Clear model from memory before switch,
fixes out of memory" (``del self.model; gc.collect()``).
"""

import gc

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None


def load(name: str) -> torch.nn.Module:
    if name == "captioner":
        return c.llava(image_px=224, patch_px=14, hidden=256, layers=2, vocab=32000)
    return c.qwen2_vl(hidden=256, layers=2, vocab=32000)


class App:
    def __init__(self) -> None:
        self.name = "captioner"
        self.model = load(self.name)

    def switch(self, name: str) -> None:
        self.model = None
        gc.collect()
        self.model = load(name)
        self.name = name

    def run(self) -> list[int]:
        family = "llava" if self.name == "captioner" else "qwen2-vl"
        inputs = zoo.make_inputs(self.model, prompt_tokens=16)
        with torch.no_grad():
            out = self.model.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs(family))
        return out[0, -4:].tolist()


def main() -> None:
    torch.manual_seed(0)
    app = App()
    print("captioner:", app.run())
    app.switch("ocr")
    print("ocr:", app.run())


if __name__ == "__main__":
    main()
