"""PyTorch's CUDA caching allocator as a pure-Python model.

Modules: ``config`` (settings, ``PYTORCH_CUDA_ALLOC_CONF`` parsing, the allocator's constants),
``model`` (``CachingAllocatorModel``: the allocation rules), ``views`` (read-only views of a
model's state: segments in snapshot format, layout, invariants) and ``replay`` (a trace through
the model). ``memwarden.plan.replay`` picks between this model and the static arena.

Speed: a replay is one dict/bisect pass, no objects per event. A pool keeps
its free blocks as a sorted list of the distinct sizes plus, per size, the
sorted addresses: ``bisect_left(sizes, size)`` then the first address is
exactly the allocator's ``lower_bound`` on (size, address), best fit with the
lowest address among equals, and an exact-size hit costs one dict lookup. The
lists stay short (tens of sizes), so ``insort`` is a short memmove: faster
than a SortedList, and no extra dependency. Neighbours are found through
``_free_size`` (start -> size) and ``_free_end`` (end -> start); segments are
placed with gaps between them, so blocks that touch in address space always
belong to the same segment.
"""
