"""One validation mechanism: gate keys, arm keys and engine options are typed tables whose
types carry their rules, checked with file and line when a config is read and again when an
instance is made in Python, so engines never re-check them."""

import json
import math
from pathlib import Path

import pytest
from helpers import rec, write_run
from hypothesis import given, settings
from hypothesis import strategies as st

from strict_gate.core.options import Refused, field_types, parse_options, read_value
from strict_gate.engines.command.engine import CommandOptions
from strict_gate.engines.hf import HFOptions
from strict_gate.engines.openai.engine import OpenAIOptions
from strict_gate.engines.recorded import RecordedOptions
from strict_gate.engines.vllm.engine import VLLMOptions
from strict_gate.errors import ConfigError
from strict_gate.gate.config import parse_gate_config
from strict_gate.judge.policy import Policy
from strict_gate.runs.layout import RunFile
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import RunStatus

MANIFEST = RunFile.MANIFEST

GATE = """name = "t"
prompts = "p.jsonl"
[reference]
kind = "hf"
model = "m"
[candidate]
kind = "hf"
model = "m"
dtype = "bfloat16"
[candidate.env]
DEVICE_KDA = "1"
"""


def refused(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        parse_gate_config(text, "/x/gate.toml")
    return e.value


@pytest.mark.parametrize(
    "old,new,line,words",
    [
        ('name = "t"', 'name = "t"\ntop_logprobs = 1', 2,
         "top_logprobs = 1 must be >= 2: near-ties are judged from the top alternatives"),
        ('name = "t"', 'name = "t"\ngreedy_tolerance = -0.5', 2, "greedy_tolerance = -0.5 must be >= 0 (nats)"),
        ('name = "t"', 'name = "t"\ngreedy_tolerance = nan', 2, "must be a finite number (nats)"),
        ('name = "t"', 'name = "t"\nmax_tokens = 0', 2, "max_tokens = 0 must be >= 1"),
        ('name = "t"', 'name = "t"\nband = -1.0', 2, "band must be a finite number >= 0 (nats), got -1.0"),
        ('name = "t"', 'name = "t"\npolicy = "lenient"', 2, "unknown policy 'lenient'; choose one of: strict"),
        ('name = "t"', 'name = "t"\ndiagnose = "yes"', 2, "diagnose = 'yes' has the wrong type: expected bool"),
        ('[reference]\nkind = "hf"\nmodel = "m"\n', 'reference = 3\n', 3, "reference = 3 has the wrong type: expected a table"),
        ('DEVICE_KDA = "1"', "DEVICE_KDA = [1]", 10, "[candidate] env = {'DEVICE_KDA': [1]} has the wrong type"),
        ('dtype = "bfloat16"', "runs = 0", 9, "[candidate] runs = 0 must be >= 1"),
        ('dtype = "bfloat16"', 'dtype = "fp16"', 9, "[candidate] dtype = 'fp16' is not allowed: expected one of 'float32'"),
        ('dtype = "bfloat16"', "batch = 2.5", 9, "[candidate] batch = 2.5 has the wrong type: expected int"),
    ],
)
def test_every_table_names_the_line_and_the_rule(old, new, line, words):
    e = refused(GATE.replace(old, new, 1))
    assert words in str(e) and e.line == line and e.path == "/x/gate.toml", str(e)


def test_missing_keys_say_how_they_are_written():
    assert 'needs prompts = "path/to/set.jsonl"' in str(refused(GATE.replace('prompts = "p.jsonl"\n', "")))
    no_ref = GATE.replace('[reference]\nkind = "hf"\nmodel = "m"\n', "")
    assert "needs a [reference] table" in str(refused(no_ref))
    assert '[candidate] needs kind = "..."' in str(refused(GATE.replace('[candidate]\nkind = "hf"\n', "[candidate]\n")))


def test_unknown_keys_are_refused_in_every_table_with_a_suggestion():
    top = refused(GATE.replace('name = "t"', 'name = "t"\ndrfit = true'))
    assert "unknown key 'drfit'; did you mean 'drift'?" in str(top) and top.line == 2
    arm = refused(GATE.replace('dtype = "bfloat16"', 'dtype = "bfloat16"\nrnus = 2'))
    assert "unknown key 'rnus' in [candidate]; did you mean 'runs'?" in str(arm) and arm.line == 10


def test_the_policy_is_an_enum_that_json_writes_as_the_string_it_was():
    cfg = parse_gate_config(GATE.replace('name = "t"', 'name = "t"\npolicy = "near-tie"'), "/x/gate.toml")
    assert cfg.policy is Policy.NEAR_TIE
    assert json.dumps({"policy": cfg.policy}) == '{"policy": "near-tie"}'
    assert parse_gate_config(GATE, "/x/gate.toml").policy is Policy.AUTO
    assert isinstance(parse_gate_config(GATE.replace('name = "t"', 'name = "t"\ngreedy_tolerance = 0'),
                                        "/x/gate.toml").greedy_tolerance, float)


@pytest.mark.parametrize(
    "build,words",
    [
        (lambda: HFOptions(model="m", dtype="fp32"), "HFOptions: dtype = 'fp32' is not allowed: expected one of"),
        (lambda: HFOptions(model="m", batch=0), "HFOptions: batch = 0 must be >= 1"),
        (lambda: HFOptions(model="m", device="gpu0"), "HFOptions: device = 'gpu0' is not a valid value"),
        (lambda: VLLMOptions(model="m", batch=0), "VLLMOptions: batch = 0 must be >= 1"),
        (lambda: VLLMOptions(model="m", dtype="fp16"), "VLLMOptions: dtype = 'fp16' is not allowed"),
        (lambda: VLLMOptions(model="m", engine_args=[1]), "VLLMOptions: engine_args = [1] has the wrong type: expected a table"),
        (lambda: VLLMOptions(model="m", gpu_memory_utilization=1.5), "gpu_memory_utilization = 1.5 must be <= 1"),
        (lambda: CommandOptions(command=["x", ""]), "CommandOptions: command = ['x', ''] must be a non-empty list of "
                                                    "non-empty strings (argv, no shell)"),
        (lambda: CommandOptions(command=["x"], timeout_s=math.inf), "CommandOptions: timeout_s = inf must be a finite number"),
        (lambda: OpenAIOptions(retries=11), "OpenAIOptions: retries = 11 must be <= 10"),
        (lambda: OpenAIOptions(serve=[]), "OpenAIOptions: serve = [] must be a non-empty list"),
        (lambda: RecordedOptions(path=3), "RecordedOptions: path = 3 has the wrong type: expected str"),
    ],
)
def test_options_made_in_python_check_themselves(build, words):
    with pytest.raises(ConfigError) as e:
        build()
    assert words in str(e.value), str(e.value)


REQUIRED = {HFOptions: {"model": "m"}, VLLMOptions: {"model": "m"}, CommandOptions: {"command": ["x"]},
            OpenAIOptions: {}, RecordedOptions: {"path": "p"}}
FIELDS = [(cls, name) for cls in REQUIRED for name in field_types(cls)]
TOML_VALUES = st.recursive(
    st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=4,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FIELDS), TOML_VALUES)
def test_a_config_and_python_accept_and_refuse_the_same_values(field, value):
    """Whatever a TOML table could hold: parse_options (the config path) and the class itself
    (the Python path) agree, and an accepted value is kept as given."""
    cls, name = field
    kwargs = REQUIRED[cls] | {name: value}
    outcomes = []
    for make in (lambda: parse_options(cls, kwargs, where="arm"), lambda: cls(**kwargs)):
        try:
            outcomes.append(make())
        except ConfigError:
            outcomes.append(None)
    assert (outcomes[0] is None) == (outcomes[1] is None), (cls.__name__, name, value)
    if outcomes[0] is not None:  # repr: a NaN inside an accepted table equals itself only so
        assert repr(outcomes[0]) == repr(outcomes[1]) and repr(getattr(outcomes[0], name)) == repr(value)


def test_read_value_refuses_with_the_rule_only():
    """The sentence's end, so each caller says where: '[arm] key = value' or 'Class: key = value'."""
    with pytest.raises(Refused) as e:
        read_value(field_types(HFOptions)["batch"], 0)
    assert e.value.problem == "must be >= 1" and not e.value.whole


def test_run_status_is_an_enum_that_manifest_json_spells_as_before(tmp_path):
    done = load_run(write_run(tmp_path / "done", [rec("p", [5])]))
    assert done.manifest.status is RunStatus.COMPLETE and done.complete
    assert json.loads((tmp_path / "done" / MANIFEST).read_text())["status"] == "complete"
    running = load_run(write_run(tmp_path / "running", [rec("p", [5])], finish=False), allow_incomplete=True)
    assert running.manifest.status is RunStatus.RUNNING and not running.complete
    assert json.loads(Path(tmp_path / "running" / MANIFEST).read_text())["status"] == "running"
