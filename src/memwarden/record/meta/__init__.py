"""Meta-device capture: the model runs on ``meta`` and a recorder stands in for the allocator
(``MetaCapture``), with a memo and replay of op decompositions so a 7B estimate takes seconds.
"""
