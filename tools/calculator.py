"""A calculator for the tool quickstart: plain functions with type hints and a docstring, as
TRL's `GRPOTrainer(tools=[...])` takes them (no r1cloud import)."""


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b
