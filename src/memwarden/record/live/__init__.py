"""Live capture of a real run: the native CPU allocator hook plus module hooks (``Capture``)."""
