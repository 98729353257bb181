"""One module per CLI command: parse arguments, call the API, print. Nothing else."""
