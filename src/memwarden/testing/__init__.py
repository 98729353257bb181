"""Memory limits as tests: the pytest plugin (``plugin``), installed with memwarden through the
``pytest11`` entry point, so ``@pytest.mark.memwarden(...)`` works in any project that has it."""
