"""Numbers no setting can take, found before anything else reads them: an integer too long for
Python to read (past 4,300 digits: named with its key and line, not Python's advice to change the
interpreter), and one beyond a 64-bit integer anywhere in the tree (said, then dropped so that no
later check prints it again)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from r1cloud.spec.problems import Problem

MAX_DIGITS = 4300  # Python's limit on converting a string of digits to an int
INT_LIMIT = 2**63 - 1  # a setting's whole number beyond a 64-bit integer fits nothing downstream


def long_number(node, path: tuple = ()) -> tuple[str | None, int]:
    """The dotted key and line of the first integer too long for Python to read, or (None, 0)."""
    if isinstance(node, yaml.ScalarNode):
        digits = node.value.lstrip("+-").replace("_", "")
        if node.tag.endswith(":int") and len(digits) > MAX_DIGITS:
            return ".".join(path) or "(the document)", node.start_mark.line + 1
    elif isinstance(node, yaml.MappingNode | yaml.SequenceNode):
        pairs = node.value if isinstance(node, yaml.MappingNode) else enumerate(node.value)
        for k, v in pairs:  # a mapping's key node, or a list's index
            found = long_number(v, (*path, str(getattr(k, "value", k))))
            if found[0] is not None:
                return found
    return None, 0


def drop_path(tree: dict, key: tuple) -> None:
    node = tree
    for part in key[:-1]:
        node = (
            node.get(part) if isinstance(node, dict) else node[int(part)] if isinstance(node, list) else None
        )
    if isinstance(node, dict):
        node.pop(key[-1], None)
    elif isinstance(node, list):
        node[int(key[-1])] = None


def huge_numbers(
    tree: Any, where: Callable[[tuple], str | None], path: tuple = (), seen: set | None = None
) -> list[Problem]:
    """Whole numbers beyond a 64-bit integer, anywhere in the tree: no setting takes one. A mapping
    or list reached again through a YAML alias is not walked again (an alias bomb would be 10^7)."""
    seen = set() if seen is None else seen
    if isinstance(tree, dict | list):
        if id(tree) in seen:
            return []
        seen.add(id(tree))
        items = tree.items() if isinstance(tree, dict) else enumerate(tree)
        return [p for k, v in items for p in huge_numbers(v, where, (*path, str(k)), seen)]
    if isinstance(tree, int) and not isinstance(tree, bool) and abs(tree) > INT_LIMIT:
        message = f"{str(tree)[:12]}… ({len(str(abs(tree)))} digits) is too large: at most 2^63 - 1"
        return [Problem(".".join(path), message, where(path))]
    return []
