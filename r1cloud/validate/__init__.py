"""Reading a blueprint with every check `r1cloud validate` makes: the files it names, the code it
imports (rewards, tools, environments), its data rows, the secrets it needs, EasyR1 shell scripts,
and the summary of the run it describes."""

from r1cloud.validate.read import load_spec
from r1cloud.validate.summary import step_count, summarize

__all__ = ["load_spec", "summarize", "step_count"]
