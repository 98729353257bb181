"""Fixed twin of ``reprefill_llava_chat_resend.py``: the cache is kept across turns and the image
sent once.

Source: transformers' cache docs, "Iterative Generation with Cache"
(https://huggingface.co/docs/transformers/v4.46.0/kv_cache):
    past_key_values = DynamicCache()
    for prompt in user_prompts:
        messages.append({"role": "user", "content": prompt})
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        outputs = model.generate(**inputs, do_sample=False, max_new_tokens=256, past_key_values=past_key_values)
        completion = tokenizer.decode(outputs[0, input_length: ], skip_special_tokens=True)
        messages.append({"role": "assistant", "content": completion})
and https://github.com/abetlen/llama-cpp-python/issues/2222 ("Once an image has been encoded, the
result can be reused"). generate() feeds only the ids the cache does not hold (the new question),
so ``pixel_values`` go with the first turn alone and the vision tower runs once.
"""

from __future__ import annotations

import torch
from _llava_chat import ChatProcessor, photo
from transformers import DynamicCache

from memwarden.models import zoo

EXPECT = None
QUESTIONS = ["What’s shown in this image?", "Describe the image in more details.",
             "What colour is the largest object?", "Is there any text in it?"]  # fmt: skip


def main() -> None:
    model = zoo.build_model("llava")
    processor = ChatProcessor(model.config)
    image = photo()
    conversation: list[dict] = []
    past_key_values = DynamicCache(config=model.config.text_config)
    for question in QUESTIONS:
        content = [{"type": "text", "text": question}]
        if not conversation:
            content.insert(0, {"type": "image"})
        conversation.append({"role": "user", "content": content})
        text_prompt = processor.apply_chat_template(conversation, add_generation_prompt=True)
        first = past_key_values.get_seq_length() == 0
        inputs = processor(images=image if first else None, text=text_prompt)  # the image once
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=0,
                                    past_key_values=past_key_values)  # fmt: skip
        answer = processor.decode(output[0, inputs["input_ids"].shape[1] :])
        conversation.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
        print(f"{inputs['input_ids'].shape[1]} prompt tokens -> {answer}")


if __name__ == "__main__":
    main()
