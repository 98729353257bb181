"""Fixed twin of ``two_models_switch.py``: the old model is released before the next one loads.

Source: https://github.com/Sanster/IOPaint/pull/165 ("we clean the model and call garbage collector":
``del self.model``, ``gc.collect()``, then load).
"""

from __future__ import annotations

import gc

import torch
from _tiny import GREEDY, prompt, tiny_llama

EXPECT = None


class Server:
    def __init__(self) -> None:
        self.model = tiny_llama(layers=4)

    def switch(self, hidden: int) -> None:
        del self.model
        gc.collect()
        self.model = tiny_llama(layers=4, hidden=hidden)

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
