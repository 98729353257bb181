"""Other tools' formats: PyTorch memory snapshots (restricted unpickler, import, export),
Chrome/Perfetto JSON, and ``load_any`` (``memwarden.load``), which sniffs a file's type.
Pure conversions plus the file edge; no torch.
"""
