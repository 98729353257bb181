"""Edge tools that sit beside the runtime: the environment doctor (``doctor/``: facts and the
known-issue data they are checked against) and the sensor-stream aligner (``align/``).

Torch-free by rule (tests/test_layering.py): the doctor reads versions from package metadata and
library files, and asks a loaded library only in a subprocess with a timeout.
"""
