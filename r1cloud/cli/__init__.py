"""The `r1cloud` command line: parse, call one function, render. Heavy libraries (torch, ray,
transformers, vllm, sky) are imported only inside the commands that need them.

One module per group of commands; importing them registers their commands on `app`, in the
order `--help` lists them."""

from __future__ import annotations

import os
import sys

from r1cloud.checkpoint.store import BucketError
from r1cloud.cli.common import app, err
from r1cloud.data import no_sklearn

# The import order is the order `--help` lists the commands in.
# isort: off
from r1cloud.cli import spec_cmds, train, jobs, plot, checkpoints, serving, evaluate  # noqa: F401
# isort: on

__all__ = ["app", "main"]


def main() -> None:
    no_sklearn.install()  # chat, try and eval load tokenizers in this process
    try:
        app()
    except BucketError as e:  # a bucket URL that cannot be used as it is, from any command
        err.print(f"error: {e.args[0]}", style="bold red", markup=False)
        for hint in e.args[1]:
            err.print(f"  ✗ {hint}", markup=False)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted", style="yellow")
        sys.exit(130)
    except Exception as e:  # a bug, not bad input: one line, the traceback on request
        if os.environ.get("R1CLOUD_DEBUG"):
            raise
        err.print(f"internal error: {type(e).__name__}: {e}", style="bold red", markup=False)
        err.print(
            "this is a bug in r1cloud; rerun with R1CLOUD_DEBUG=1 for the traceback and report it",
            markup=False,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
