"""One module per fact source. Each ``collect`` returns a JSON-ready dict with a ``status``
("present", "not present" or "error") and never raises for a missing or unreadable file.
"""
