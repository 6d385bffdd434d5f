"""r1cloud: R1-style reinforcement learning with one command, anywhere."""

__version__ = "0.1.0"
