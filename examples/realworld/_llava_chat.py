"""A stand-in for ``LlavaProcessor`` for the chat cases: the LLaVA-1.5 prompt format, a word-level
tokenizer and a real ``CLIPImageProcessor`` (numpy ``pixel_values``), with no downloads.

The prompt format is the one transformers' LLaVA docs settled on
(https://github.com/huggingface/transformers/pull/30130):
    "USER: <image>\\n<prompt_1> ASSISTANT:<response_1></s>USER: <prompt_2> ASSISTANT:<response_2> etc"
and, as ``LlavaProcessor`` does, each ``<image>`` becomes ``image_seq_length`` image tokens.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import CLIPImageProcessor

_WORD = re.compile(r"<image>|</s>|\S+")


class ChatProcessor:
    def __init__(self, config: Any) -> None:
        side = config.vision_config.image_size
        self.images = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
        self.image_token, self.image_tokens = config.image_token_id, config.image_seq_length
        self.vocab, self.eos, self.bos = config.text_config.vocab_size, config.text_config.eos_token_id, 1

    def apply_chat_template(self, conversation: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        text = ""
        for message in conversation:
            parts = [("<image>\n" if c["type"] == "image" else c["text"]) for c in message["content"]]
            if message["role"] == "user":
                text += "USER: " + "".join(parts) + " "
            else:
                text += "ASSISTANT: " + "".join(parts) + "</s>"
        return text + ("ASSISTANT:" if add_generation_prompt else "")

    def _id(self, word: str) -> list[int]:
        if word == "<image>":
            return [self.image_token] * self.image_tokens
        if word == "</s>":
            return [self.eos]
        if re.fullmatch(r"w\d+", word):  # a generated token decoded by ``decode``
            return [int(word[1:])]
        return [3 + zlib.crc32(word.encode()) % (self.vocab - 8)]

    def __call__(self, text: str, images: Image.Image | None = None) -> dict[str, torch.Tensor]:
        ids = [self.bos] + [i for word in _WORD.findall(text) for i in self._id(word)]
        out = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        if images is not None:
            out["pixel_values"] = self.images(images=images, return_tensors="pt")["pixel_values"]
        return out

    def decode(self, ids: torch.Tensor) -> str:
        return " ".join(f"w{int(i)}" for i in ids)


def photo(seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (96, 128, 3), dtype=np.uint8))
