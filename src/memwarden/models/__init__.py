"""What memwarden runs and runs on: the zoo of tiny transformers VLMs (``zoo/``), the chat
deployment of the demo and stress campaigns (chat), device profiles (devices, ``devices/*.toml``)
and real-model configs (``configs/*.json``).
"""
