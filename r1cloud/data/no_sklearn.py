"""transformers 5 imports scikit-learn's metrics at start-up wherever scikit-learn is installed
(mlflow's full package brings it), and with them scipy.stats and pandas, in every process that
loads a model or tokenizer (docs/development.md, "Start-up", has the cost) — for one thing r1cloud never
uses, assisted generation's confidence threshold (`roc_curve`, transformers/generation/
candidate_generator.py). `install()`, called first thing in the processes that load models (the
CLI, the trainer, each worker, eval, the servers, the reward and sandbox processes), tells that one module scikit-learn is absent
while it loads; scikit-learn itself stays importable (a reward function may use it)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys


class _Finder(importlib.abc.MetaPathFinder):
    MODULE = "transformers.generation.candidate_generator"

    def find_spec(self, name, path, target=None):
        if name != self.MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            import transformers.utils as utils

            present = utils.is_sklearn_available
            utils.is_sklearn_available = lambda: False
            try:
                load(module)
            finally:
                utils.is_sklearn_available = present

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Hide scikit-learn from transformers' assisted generation in this process (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
