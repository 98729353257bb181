"""The data model and nothing else: ``Trace`` and its enums (model), the ``.mwtrace`` bytes
(format: dumps/loads, validated), files (io: save/load/atomic_write) and typed steps (steps).
Imports nothing of memwarden but ``errors``; never torch.
"""
