"""A demo app with a model drop-down: switching from the LLaVA-style captioner to the Qwen2-VL-style
OCR model loads the new model while the old one is still referenced by the app state.

Source: https://github.com/Sanster/IOPaint/pull/165 — "Clear model from memory before switch,
fixes out of memory": "switch() ... was not clearing current loaded model before loading new one,
causing a lot of memory usage" (fix: ``del self.model; gc.collect()`` before loading).
See also https://github.com/h2oai/h2ogpt/issues/188 ("if i change the model again ... it return a
out of memory error. I guess the model should also be released from the memory").

While the new model is built, both models' weights are alive.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = "two-models-alive"
FIX_WORDS = ("del", "None", "release", "free", "unload", "gc.collect")


def load(name: str) -> torch.nn.Module:
    if name == "captioner":
        return c.llava(image_px=224, patch_px=14, hidden=256, layers=2, vocab=32000)
    return c.qwen2_vl(hidden=256, layers=2, vocab=32000)


class App:
    def __init__(self) -> None:
        self.name = "captioner"
        self.model = load(self.name)

    def switch(self, name: str) -> None:
        self.model = load(name)  # MISTAKE
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
