"""Adapter sync between a server and devices: versioned LoRA adapter manifests, per-tensor
deltas, and an HTTP service (``server``/``client``) that moves them.

Torch-free like all of ``edge/``: these modules move and verify bytes and manifests only;
applying an adapter to a model is ``runtime/lora``'s job.
"""
