"""A chat about one image, written as transformers' LLaVA docs write a multi-turn prompt: the
whole conversation, image included, goes through the processor and ``generate()`` every turn.

Source: https://github.com/huggingface/transformers/pull/31691 (docs/source/en/model_doc/llava.md,
the multi-turn example):
    conversation = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What’s shown in this image?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "This image shows a red stop sign."},]},
        {"role": "user", "content": [{"type": "text", "text": "Describe the image in more details."}]},
    ]
    text_prompt = processor.apply_chat_template(conversation, add_generation_prompt=True)
and the request it leads to, https://github.com/abetlen/llama-cpp-python/issues/2222:
    "In multi-turn conversations that include images, the image encoding is performed on each
     turn. ... Once an image has been encoded, the result can be reused, rather than re-encoding
     every turn."

Each turn appends the answer and a new question to ``conversation``, renders it, runs the
processor on the image and the text again and calls ``generate(**inputs)``: the vision tower
encodes the same pixels every turn, and the language model prefills the whole history again.
Fix (``_fixed``): keep a cache across turns (``past_key_values=``) and send the image once.
"""

from __future__ import annotations

import torch
from _llava_chat import ChatProcessor, photo

from memwarden.models import zoo

EXPECT = "kv-reprefill"
FIX_WORDS = ("cache",)
QUESTIONS = ["What’s shown in this image?", "Describe the image in more details.",
             "What colour is the largest object?", "Is there any text in it?"]  # fmt: skip


def main() -> None:
    model = zoo.build_model("llava")
    processor = ChatProcessor(model.config)
    image = photo()
    conversation: list[dict] = []
    for question in QUESTIONS:
        content = [{"type": "text", "text": question}]
        if not conversation:
            content.insert(0, {"type": "image"})
        conversation.append({"role": "user", "content": content})
        text_prompt = processor.apply_chat_template(conversation, add_generation_prompt=True)
        inputs = processor(images=image, text=text_prompt)  # the image again, every turn
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=0)  # MISTAKE
        answer = processor.decode(output[0, inputs["input_ids"].shape[1] :])
        conversation.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
        print(f"{inputs['input_ids'].shape[1]} prompt tokens -> {answer}")


if __name__ == "__main__":
    main()
