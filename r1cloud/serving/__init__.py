"""Serving a model or checkpoint through an OpenAI-compatible endpoint: what to serve and how to
start it (serve), the two servers (vllm_server, openai_server), and `r1cloud chat` (chat)."""
