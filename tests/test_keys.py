"""No silent keys: every key the schema accepts is classified in r1cloud/spec/keys.py, and each
refused key says so when it is set (exit 2, one line); tests/test_docs.py checks the generated key
reference says the same."""

from fnmatch import fnmatchcase

import pytest

from r1cloud.spec.keys import HONOURED, INERT, KEYS, REFUSED, classify, leaves

LEAVES = [".".join(k) for k in leaves()]
# a value other than the default for each refused key
VALUES = {
    "worker.hybrid_engine": "false",
    "fsdp_size": "1",
    "environment": "envs/game.py:Game",
    "partial_rollout": "true",
}


def value_for(path: str) -> str:
    return next(v for k, v in VALUES.items() if path == k or path.endswith("." + k))


def test_every_key_is_classified_and_every_entry_is_used():
    assert len(LEAVES) > 200
    unclassified = [k for k in LEAVES if classify(k) is None]
    assert unclassified == []
    unused = [p for p in KEYS if not any(fnmatchcase(k, p) for k in LEAVES)]
    assert unused == []
    for kind, text in KEYS.values():
        assert kind in (HONOURED, INERT, REFUSED) and len(text) > 20


REFUSED_KEYS = [k for k in LEAVES if classify(k)[0] == REFUSED]


@pytest.mark.parametrize("path", REFUSED_KEYS)
def test_each_refused_key_says_so_when_set(blueprint, cli, path):
    _, text = classify(path)
    r = cli("validate", blueprint(), f"{path}={value_for(path)}")
    lines = [x for x in r.stderr.splitlines() if f"{path}: {text}" in x]
    assert r.exit_code == 2 and len(lines) == 1 and "✗" in lines[0], r.stderr


@pytest.mark.parametrize(
    "overrides,named",
    [
        ([], ["worker.actor.offload.offload_params", "worker.ref.offload.offload_params"]),
        (["algorithm.disable_kl=true"], ["worker.actor.offload.offload_params"]),  # no reference model
        (["worker.actor.model.lora.rank=8"], ["worker.actor.offload.offload_params"]),  # the actor is it
        (["algorithm.adv_estimator=gae", "worker.critic.global_batch_size=8",
          "worker.critic.model.model_path=Qwen/Qwen2.5-0.5B-Instruct",
          "worker.critic.offload.offload_params=true"],
         ["worker.actor.offload.offload_params", "worker.ref.offload.offload_params",
          "worker.critic.offload.offload_params"]),
    ],
)  # fmt: skip
def test_the_offload_line_names_only_models_the_run_has(blueprint, overrides, named):
    from r1cloud.trainer.offload import note
    from r1cloud.validate import load_spec

    base = ["algorithm.disable_kl=false", "worker.actor.offload.offload_params=true"]
    base += ["worker.ref.offload.offload_params=true"]
    spec = load_spec(blueprint(), base + overrides).spec
    assert note(spec, cuda=True) == "[offload] " + ", ".join(named)
