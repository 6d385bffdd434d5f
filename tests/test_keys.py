"""No silent keys: every key the schema accepts is classified in r1cloud/spec/keys.py, and each key
that is not honoured says so when it is set — refused (exit 2) or warned (one line)."""

from fnmatch import fnmatchcase

import pytest

from r1cloud.spec.keys import INERT, KEYS, REFUSED, WARNED, classify, leaves

LEAVES = [".".join(k) for k in leaves()]
# a value other than the default for each key that is not honoured
VALUES = {
    "bool": "true",
    "worker.hybrid_engine": "false",
    "worker.actor.ulysses_size": "2",
    "worker.critic.ulysses_size": "2",
    "worker.ref.ulysses_size": "2",
    "fsdp_size": "1",
    "optim.strategy": "adamw_bf16",
}


def value_for(path: str) -> str:
    for key, value in VALUES.items():
        if path == key or path.endswith("." + key):
            return value
    return VALUES["bool"]


def test_every_key_is_classified_and_every_entry_is_used():
    assert len(LEAVES) > 200
    unclassified = [k for k in LEAVES if classify(k) is None]
    assert unclassified == []
    unused = [p for p in KEYS if not any(fnmatchcase(k, p) for k in LEAVES)]
    assert unused == []
    for kind, text in KEYS.values():
        assert kind in ("honoured", INERT, WARNED, REFUSED) and len(text) > 20


NOT_HONOURED = [k for k in LEAVES if classify(k)[0] in (WARNED, REFUSED)]


@pytest.mark.parametrize("path", NOT_HONOURED)
def test_each_key_not_honoured_says_so_when_set(blueprint, cli, path):
    kind, text = classify(path)
    overrides = [f"{path}={value_for(path)}"]
    if path.endswith("fsdp.enable_cpu_offload"):  # EasyR1 refuses offload with gradient accumulation
        overrides += ["worker.actor.micro_batch_size_per_device_for_update=16",
                      "worker.critic.micro_batch_size_per_device_for_update=16"]  # fmt: skip
    r = cli("validate", blueprint(), *overrides)
    lines = [x for x in r.stderr.splitlines() if f"{path}: {text}" in x]
    if kind == REFUSED:
        assert r.exit_code == 2 and len(lines) == 1 and "✗" in lines[0], r.stderr
    else:
        assert r.exit_code == 0, r.stderr
        assert len(lines) == 1 and lines[0].startswith("warning:"), r.stderr


def test_the_readme_lists_every_key_not_honoured():
    from spec_helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    for pattern, (kind, _) in KEYS.items():
        if kind in (WARNED, REFUSED):
            assert f"`{pattern}`" in readme, pattern
