"""The bundled trainer: runs on the nodes as `python -m r1cloud.trainer RUN_DIR`."""
