"""Every way a run becomes a ``Trace``. The attribution core (attribution, modality rules,
call inputs, the native allocator recorder) is shared by the two recorders: ``live/`` (a real
run on CPU) and ``meta/`` (the same model on the meta device, for estimates). ``api.capture``
is ``memwarden.capture``.
"""
