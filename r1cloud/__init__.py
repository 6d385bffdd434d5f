"""r1cloud: R1-style reinforcement learning with one command, anywhere."""

import importlib.abc
import importlib.machinery
import sys

__version__ = "0.1.0"


class _NoSklearnForAssistedGeneration(importlib.abc.MetaPathFinder):
    """transformers 5 imports scikit-learn's metrics at start-up wherever scikit-learn is installed
    (mlflow's full package brings it), and with them scipy.stats and pandas: 3.4 s of CPU in every
    process that loads a model or tokenizer — a trainer start has three — for one thing r1cloud never
    uses, assisted generation's confidence threshold (`roc_curve`, transformers/generation/
    candidate_generator.py). While that one module loads it is told scikit-learn is absent;
    scikit-learn itself stays importable (a reward function may use it)."""

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


sys.meta_path.insert(0, _NoSklearnForAssistedGeneration())
