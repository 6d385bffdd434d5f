"""`python -m r1cloud.trainer RUN_DIR`: train from the resolved spec in RUN_DIR/spec.yaml.

`USE_MODELSCOPE_HUB=1` (as in EasyR1) makes Hub ids of models and datasets download from the
ModelScope hub, through modelscope's own patch of the Hugging Face libraries."""

import importlib.util
import os
import sys


def use_modelscope() -> None:
    if os.getenv("USE_MODELSCOPE_HUB", "0").lower() not in ("true", "y", "1"):
        return
    if importlib.util.find_spec("modelscope") is None:
        print(
            "error: USE_MODELSCOPE_HUB is set but modelscope is not installed: pip install modelscope "
            "(or unset USE_MODELSCOPE_HUB to use the Hugging Face Hub)",
            file=sys.stderr,
        )
        sys.exit(2)
    from modelscope.utils.hf_util import patch_hub

    patch_hub()


if len(sys.argv) != 2:
    print("usage: python -m r1cloud.trainer RUN_DIR", file=sys.stderr)
    sys.exit(2)
from r1cloud.data import no_sklearn  # noqa: E402

no_sklearn.install()  # before modelscope's patch loads transformers' generation classes
use_modelscope()
from r1cloud.trainer.driver import main  # noqa: E402 - after the hub is chosen

sys.exit(main(sys.argv[1]))
