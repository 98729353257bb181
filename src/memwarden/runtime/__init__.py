"""Serving under a budget: ``GovernedSession`` and what it holds (paged KV pool, media and
encoder caches, admission, degradation ladder, token pruning, int4 weights, weight streaming).
"""
