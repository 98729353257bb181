"""Tiny transformers models for the real-world corpus: random weights, built on CPU, no downloads.

Every case imports what it needs from here, so each script stays as short as the snippet it
reproduces. ``memwarden trace`` puts the script's folder on ``sys.path``, as ``python`` does.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 1000


def llama_config(layers: int = 2, hidden: int = 256) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def tiny_llama(dtype: torch.dtype = torch.float32, layers: int = 2, hidden: int = 256) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights, in eval mode."""
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(llama_config(layers, hidden), dtype=dtype)
    return model.eval()


def saved_tiny_llama(dtype: torch.dtype = torch.float32, layers: int = 2, hidden: int = 256) -> Path:
    """A tiny Llama saved with ``save_pretrained`` (safetensors) in a temporary folder; its path."""
    path = Path(tempfile.mkdtemp(prefix="memwarden-rw-"))
    tiny_llama(dtype, layers, hidden).save_pretrained(path)
    return path


def prompt(tokens: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, tokens), generator=gen)  # (B, T)


GREEDY = {"do_sample": False, "eos_token_id": None, "pad_token_id": 0}
