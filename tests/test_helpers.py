"""The test helpers' own promises: the TOML the gate helpers write reads back as the dict it came
from, and the one fake OpenAI server stops when asked."""

from __future__ import annotations

import math
import tomllib
import urllib.error
import urllib.request

import pytest
from engines.fake_openai_server import FakeOpenAIServer
from helpers import gate_text, toml_text, write_gate
from hypothesis import given, settings
from hypothesis import strategies as st

SCALARS = st.one_of(
    st.text(), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.booleans(),
    st.floats(allow_nan=False),  # nan != nan: checked on its own below
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(), inner, max_size=4)), max_leaves=12)
TABLES = st.recursive(st.dictionaries(st.text(), VALUES, max_size=5),
                      lambda inner: st.dictionaries(st.text(), st.one_of(VALUES, inner), max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(TABLES)
def test_toml_text_reads_back_as_the_dict_it_came_from(table):
    assert tomllib.loads(toml_text(table)) == table


def test_control_characters_quotes_and_non_finite_floats_survive():
    table = {"s": 'a"b\\c\x00\x1f\x7f\n\t\r\u2028é', "k y": {"x.z": [float("inf"), -float("inf"), 1e-300]}}
    assert tomllib.loads(toml_text(table)) == table
    assert math.isnan(tomllib.loads(toml_text({"band": float("nan")}))["band"])
    with pytest.raises(TypeError, match="None"):
        toml_text({"x": None})


def test_gate_text_puts_the_top_level_keys_before_the_tables(tmp_path):
    text = gate_text(reference={"kind": "hf", "env": {"A": "1"}}, candidate={"kind": "recorded", "path": tmp_path},
                     speed={"runs": 1}, name="g", max_tokens=2)
    assert text.splitlines()[:3] == ['name = "g"', "max_tokens = 2", "[reference]"]
    data = tomllib.loads(text)
    assert data["reference"]["env"] == {"A": "1"} and data["candidate"]["path"] == str(tmp_path)
    assert list(data) == ["name", "max_tokens", "reference", "candidate", "speed"]
    path = write_gate(tmp_path, file="x.toml", reference={"kind": "hf"}, name="w")
    assert path == tmp_path / "x.toml" and tomllib.loads(path.read_text()) == {"name": "w", "reference": {"kind": "hf"}}


def test_the_fake_server_answers_on_127_0_0_1_and_is_gone_after_stop():
    srv = FakeOpenAIServer().start()
    assert srv.url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(srv.url + "/v1/models", timeout=5) as r:
        assert r.status == 200
    srv.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(srv.url + "/v1/models", timeout=5)
