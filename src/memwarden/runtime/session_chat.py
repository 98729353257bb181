"""A conversation a GovernedSession keeps for ``chat()``: earlier messages, replies and media.

Each turn the whole conversation is sent again, as a chat loop would; prefix reuse makes that cost
only the new part. The media are kept joined (one tensor per key) while no new media come, so the
session sees the same tensors every turn and fingerprints them once (``runtime/media.py`` keys its
fingerprints by tensor identity and version).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from memwarden.runtime.session_inputs import PER_TOKEN_KEYS


@dataclass
class Conversation:
    input_ids: list[int] = field(default_factory=list)
    media: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    per_token: dict[str, list[int]] = field(default_factory=dict)
    joined: dict[str, torch.Tensor] | None = None  # the media as one tensor per key, until new media come
    ids: torch.Tensor | None = None  # input_ids as (1, T), grown by cat: a tensor from the list costs ~0.1 ms a turn

    def turn(self, input_ids: torch.Tensor, inputs: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        """Add a message (``input_ids`` (1, T) and its media); returns the whole conversation's ids and inputs."""
        for key, value in inputs.items():
            if isinstance(value, torch.Tensor) and key not in PER_TOKEN_KEYS:
                self.media.setdefault(key, []).append(value)
                self.joined = None
        for key in PER_TOKEN_KEYS[1:]:
            if isinstance(inputs.get(key), torch.Tensor):
                self.per_token.setdefault(key, [0] * len(self.input_ids)).extend(inputs[key][0].tolist())
            elif key in self.per_token:  # a text message without them: text (0), as the processor would mark it
                self.per_token[key].extend([0] * input_ids.shape[1])
        self.input_ids.extend(input_ids[0].tolist())
        new = input_ids.detach().cpu()
        full = new.clone() if self.ids is None else torch.cat([self.ids.to(new.dtype), new], 1)  # (1, T)
        self.ids = full
        if self.joined is None:
            self.joined = {k: v[0] if len(v) == 1 else torch.cat(v) for k, v in self.media.items()}
        call: dict[str, Any] = dict(self.joined)
        call.update({k: v for k, v in inputs.items() if not isinstance(v, torch.Tensor)})  # generate() keywords
        call.update({k: torch.tensor([v], dtype=torch.long) for k, v in self.per_token.items()})
        return full, call

    def reply(self, reply: list[int]) -> None:
        """Add the session's reply (token ids) to the conversation."""
        self.input_ids.extend(reply)
        if self.ids is not None:
            self.ids = torch.cat([self.ids, torch.tensor([reply], dtype=self.ids.dtype)], 1)
        for key in self.per_token:
            self.per_token[key].extend([0] * len(reply))


__all__ = ["Conversation"]
