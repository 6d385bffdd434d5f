"""`python -m r1cloud.trainer RUN_DIR`: train from the resolved spec in RUN_DIR/spec.yaml."""

import sys

from .driver import main

if len(sys.argv) != 2:
    print("usage: python -m r1cloud.trainer RUN_DIR", file=sys.stderr)
    sys.exit(2)
sys.exit(main(sys.argv[1]))
