"""Property-based: whatever keys, values, types and override strings a user writes, loading ends
in a spec or in SpecError with readable problems — never another exception, never a traceback."""

import os
import textwrap

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from r1cloud.cli import app
from r1cloud.spec import SpecError
from r1cloud.spec.load import all_keys
from r1cloud.validate import load_spec
from spec_helpers import MINIMAL

KEYS = [".".join(k) for k in all_keys()]
SETTINGS = settings(
    max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", 150)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
key_paths = st.one_of(
    st.sampled_from(KEYS),
    st.builds(
        lambda k, extra: f"{k}.{extra}", st.sampled_from(KEYS), st.from_regex(r"[a-z_]{1,8}", fullmatch=True)
    ),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}(\.[A-Za-z_][A-Za-z0-9_]{0,8}){0,3}", fullmatch=True),
)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("prop")
    p = d / "job.yaml"
    p.write_text(textwrap.dedent(MINIMAL))
    return p


def _load(path, overrides):
    try:
        return load_spec(path, overrides)
    except SpecError as e:
        assert e.problems, "SpecError without problems"
        for p in e.problems:
            assert p.render().strip() and "\n" not in p.render()
        return None


@SETTINGS
@given(key=key_paths, value=values)
def test_any_key_and_value(base, key, value):
    _load(
        base, [f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"]
    )


@SETTINGS
@given(text=st.text(max_size=60))
def test_any_override_string(base, text):
    _load(base, [text])


@SETTINGS
@given(tree=st.dictionaries(key_paths, values, max_size=6))
@example(tree={"secrets": {"\n": False}})  # a secret's name once broke its line
def test_any_yaml_document(tmp_path, tree):
    doc: dict = {}
    for dotted, value in tree.items():
        node = doc
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else node
        if isinstance(node, dict):
            node[parts[-1]] = value
    path = tmp_path / "random.yaml"
    path.write_text(yaml.safe_dump(doc))
    _load(path, [])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=key_paths, value=st.text(max_size=15))
def test_cli_never_shows_a_traceback(base, key, value):
    os.environ.pop("R1CLOUD_DEBUG", None)
    r = CliRunner().invoke(app, ["validate", str(base), f"{key}={value}"])
    assert r.exit_code in (0, 2), (r.exit_code, r.stdout, r.stderr, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert "Traceback" not in r.stdout + r.stderr
