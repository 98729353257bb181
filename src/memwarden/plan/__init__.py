"""Planners over plain data: the caching-allocator model (``allocator/``), static arenas
(``arena/``), ``replay`` (one entry over both, results in ``records``) and tier placement.
No torch.
"""
