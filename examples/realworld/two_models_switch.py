"""A server that switches to another model by loading it over the name of the old one.

Source: https://github.com/Sanster/IOPaint/pull/165
    "Function switch() from model_manager.py was not clearing current loaded model before loading new
     one, causing a lot of memory usage. In systems with 4GB (RTX 3050 Laptop) was not able to handle it."
and https://github.com/lum3on/comfyui_HiDream-Sampler/issues/13 ("Model stay in memory when switching
... if I change from dev (after a generation) to full I get an OOM message").

``model = load(next)`` frees the old model only once the new one is built, so both sets of weights
are alive through the load. Fix (``_fixed``): ``del`` the old model (and ``gc.collect()``) first.
"""

from __future__ import annotations

import torch
from _tiny import GREEDY, prompt, tiny_llama

EXPECT = "two-models-alive"
FIX_WORDS = ("del model",)


class Server:
    def __init__(self) -> None:
        self.model = tiny_llama(layers=4)

    def switch(self, hidden: int) -> None:
        self.model = tiny_llama(layers=4, hidden=hidden)  # MISTAKE

    def answer(self, seed: int) -> list[int]:
        with torch.no_grad():
            return self.model.generate(prompt(32, seed=seed), max_new_tokens=8, **GREEDY)[0, -8:].tolist()


def main() -> None:
    server = Server()
    print(server.answer(0))
    server.switch(hidden=320)
    print(server.answer(1))


if __name__ == "__main__":
    main()
