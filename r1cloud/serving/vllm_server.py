"""`python -m r1cloud.serving.vllm_server ARGS`: vLLM's OpenAI-compatible server (the same arguments), with
`vision_compat` in place, so Qwen-VL models serve on a machine without torchvision, pictures and
videos (r1cloud's video processor; `serve.media_limits` says how many and how they are normalized).

vLLM's CPU build starts its engine and worker processes with `spawn`, and a spawned process
imports the parent's main module again (as `__mp_main__`): so the shim is installed at this
module's top level, where every one of them runs it, and the model class is registered for
in-process inspection there too (prepare_vllm). sys.argv is the parent's in each of them."""

from __future__ import annotations

import sys

from r1cloud.data import no_sklearn

no_sklearn.install()  # before vLLM loads transformers (this module is a process's main)

from r1cloud.media import compat as vision_compat
from r1cloud.serving.serve import media_limits


def _config(argv: list[str]):
    if "--model" not in argv or argv.index("--model") + 1 >= len(argv):
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(argv[argv.index("--model") + 1])
    except (OSError, ValueError):  # vLLM says what is wrong with the model itself
        return None


if vision_compat.torchvision_missing():
    _found = _config(sys.argv[1:])
    vision_compat.prepare_vllm((_found.architectures or []) if _found is not None else [])


def main() -> None:
    from vllm.entrypoints.launchers.api_server.entry import main as serve

    if vision_compat.torchvision_missing():
        sys.argv[1:] = media_limits(sys.argv[1:], _found)
    serve()


if __name__ == "__main__":
    main()
