"""Checkpoints: written by the trainer (write), found and listed (store), read without running
their code (dcp), converted to a model folder (merge)."""
