"""The gate's insides: the GateSpec it is judged by, the one owner of its engine lifetimes,
the report directory's file names, and the comparison computed once per gate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import confident, rec, step, write_run

import strict_gate.judge.compare_runs as compare  # where the run comparison looks compare_prompt up
from strict_gate.engines.base import Engine
from strict_gate.errors import ConfigError
from strict_gate.gate.config import load_gate_config
from strict_gate.gate.lifetimes import Lifetimes
from strict_gate.gate.run import run_gate
from strict_gate.judge.policy import Policy
from strict_gate.judge.spec import GateSpec, PromptSetRef
from strict_gate.runs.layout import REPORT_FORMATS, ReportDir
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.records import EngineInfo, Sampling


class Closing(Engine):
    """A hand-written engine that only records its start() and close() calls (no model: the
    lifetimes are what is under test, and every real engine's close() is safe to call twice)."""

    kind = "closing"
    Options = dict

    def __init__(self, name: str, calls: list[str], *, env: dict[str, str] | None = None, fail_close: bool = False):
        super().__init__({}, env=env)
        self.name, self.calls, self.fail_close = name, calls, fail_close

    def start(self) -> None:
        self.calls.append(f"start {self.name}")

    def close(self) -> None:
        self.calls.append(f"close {self.name}")
        if self.fail_close:
            raise RuntimeError(f"{self.name} would not stop")

    def info(self) -> EngineInfo:
        return EngineInfo(kind=self.kind, model=self.name)

    def tokenize(self, text: str) -> list[int]:
        return [1]

    def generate(self, prompts, sampling):
        return iter(())


def test_lifetimes_close_each_owned_engine_once_at_its_phase_or_on_the_way_out(tmp_path):
    calls: list[str] = []
    ref, cand, given = Closing("ref", calls), Closing("cand", calls), Closing("given", calls)
    with Lifetimes(ReportDir(tmp_path)) as engines:
        engines.own("reference", ref)
        engines.own("candidate", cand)
        engines.close(cand)
        engines.close(cand, given)  # already closed; not the gate's
        calls.append("between")
    assert calls == ["close cand", "between", "close ref"]


def test_lifetimes_close_a_restarted_engine_again(tmp_path):
    calls: list[str] = []
    cand, given = Closing("cand", calls), Closing("given", calls)
    with Lifetimes(ReportDir(tmp_path)) as engines:
        engines.own("candidate", cand)
        engines.close(cand)
        engines.reopen(cand)  # the drift pass restarts it
        engines.reopen(given)  # not the gate's: still not closed
    assert calls == ["close cand", "close cand"]


def test_lifetimes_close_every_engine_and_scrub_when_a_phase_fails_or_an_engine_will_not_stop(tmp_path):
    calls: list[str] = []
    secret = "sk-phases-0123456789"
    ref = Closing("ref", calls, env={"API_KEY": secret})  # an arm's env registers its secrets
    cand = Closing("cand", calls, fail_close=True)
    extra = Closing("rescorer", calls)
    log = tmp_path / "reference" / "engine.log"
    log.parent.mkdir()
    with pytest.raises(RuntimeError, match="cand would not stop"), Lifetimes(ReportDir(tmp_path)) as engines:
        engines.own("reference", ref)
        engines.own("candidate", cand)
        engines.own("reference", extra)
        log.write_text(f"server started with --api-key {secret}\n")
        raise KeyboardInterrupt  # what a Ctrl-C in the reference arm is to the gate
    assert calls == ["close rescorer", "close cand", "close ref"]  # the one that raised did not stop the others
    assert secret not in log.read_text() and "server started" in log.read_text()


@pytest.mark.parametrize("policy, band", [("lenient", 0.5), ("strict", -0.1), ("strict", math.nan),
                                          ("strict", math.inf), ("strict", True)])
def test_a_spec_refuses_an_unknown_policy_or_a_bad_band(policy, band):
    with pytest.raises(ConfigError):
        GateSpec("g", PromptSetRef.stored({"sha256": "0" * 64}, None), Sampling(4, 2), policy=policy, band=band)


def test_a_spec_holds_its_policy_as_the_enum_and_its_band_as_a_float():
    spec = GateSpec("g", PromptSetRef.stored({"sha256": "a" * 64}, ["p0"]), Sampling(4, 2), policy="near-tie", band=1)
    assert spec.policy is Policy.NEAR_TIE and isinstance(spec.band, float) and spec.band == 1.0
    assert spec.prompt_set.sha256 == "a" * 64 and spec.prompt_set.ids == ("p0",)


def _offline_gate(tmp_path: Path, extra: str = "") -> Path:
    """Two stored runs over three prompts, one diverging at a near-tie, as a recorded gate."""
    prompts = tmp_path / "set.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2, 3]}) + "\n" for i in range(3)))
    sha = load_prompts(prompts).sha256
    ref = [rec("p0", [5, 6]), rec("p1", [8, 9]), rec("p2", [11, 12], tops=[confident(11), step((12, -0.6), (40, -0.7))])]
    cand = [rec("p0", [5, 6]), rec("p1", [8, 9]), rec("p2", [11, 40], tops=[confident(11), step((40, -0.65), (12, -0.68))])]
    write_run(tmp_path / "ref", ref, sha=sha, max_tokens=2, model="tiny")
    write_run(tmp_path / "cand", cand, sha=sha, max_tokens=2, model="tiny")
    gate = tmp_path / "gate.toml"
    gate.write_text(
        f'name = "phases"\nprompts = "set.jsonl"\nmax_tokens = 2\npolicy = "strict"\n'
        f'output_dir = "{tmp_path / "reports"}"\n{extra}'
        '[reference]\nkind = "recorded"\npath = "ref"\nmodel = "tiny"\n'
        '[candidate]\nkind = "recorded"\npath = "cand"\n'
    )
    return gate


def test_a_gate_compares_its_runs_once(tmp_path, monkeypatch):
    """A stored reference cannot re-score, so the gate looks at the comparison to decide whether
    to load a [rescorer]: that look and the verdict share one comparison."""
    seen: list[str] = []
    real = compare.compare_prompt  # what every comparison of two runs calls, once per prompt
    monkeypatch.setattr(compare, "compare_prompt", lambda pid, *a: seen.append(pid) or real(pid, *a))
    outcome = run_gate(load_gate_config(_offline_gate(tmp_path)))
    assert outcome.result.comparison.summary.counts["near_tie"] == 1
    assert seen == ["p0", "p1", "p2"]


def test_the_report_directory_holds_the_files_report_dir_names(tmp_path):
    outcome = run_gate(load_gate_config(_offline_gate(tmp_path)))
    report = ReportDir(outcome.report_dir)
    named = [report.gate_toml, report.state, *(report.report(fmt) for fmt in REPORT_FORMATS)]
    named += [f for role in ("reference", "candidate") for f in (report.arm(role).manifest, report.arm(role).records)]
    assert all(p.is_file() for p in named), [p.name for p in named if not p.is_file()]
    assert not report.arm("candidate").partial.exists()  # a finished run leaves no .partial
    state = json.loads(report.state.read_text())
    written = json.loads(report.report_json.read_text())
    assert state["config"] == written["config"]  # the config reaches both files in one shape
    assert (state["policy"], state["band"]) == (written["policy"], written["band"])
    assert state["prompt_set"]["sha256"] == written["prompt_set"]["sha256"]


def test_every_registered_feature_imports_and_names_its_config():
    """FEATURES is read as "module:Class" strings: a typo or a moved module fails here, not in a gate.
    Each feature's table is parsed by its own folder (the registry's `config`), or, for drift's one
    top-level key, is a GateConfig field."""
    from dataclasses import fields

    from strict_gate.core.features import by_name
    from strict_gate.gate.config import GateConfig
    from strict_gate.gate.feature import Feature, feature_classes

    names = [cls.name for cls in feature_classes()]
    assert names == ["speed", "drift", "localize", "invariance", "noise", "golden"]  # the order their hooks run
    assert all(issubclass(cls, Feature) for cls in feature_classes())
    assert all(by_name()[n].config is not None or n in {f.name for f in fields(GateConfig)} for n in names)
