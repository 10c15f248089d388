"""The wings keep their imports pointing one way (docs/architecture.md).

Every import in the package is read from source (top level, inside functions and under
TYPE_CHECKING alike: a lazy import is still a dependency) and checked against WINGS, the
one place the allowed directions are written down, with FACES, the modules of a feature's
folder that rank above gate/ and report/.
"""

from __future__ import annotations

import ast
import importlib
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "strict_gate"

# wing -> the wings it may import. `errors` is the error hierarchy every wing raises;
# `face` is cli/ and __init__.py, which may import anything and which nothing imports.
WINGS: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "core": frozenset({"errors"}),
    "runs": frozenset({"core", "errors"}),
    "engines": frozenset({"runs", "core", "errors"}),
    "speed": frozenset({"engines", "runs", "core", "errors"}),
    "judge": frozenset({"runs", "core", "errors"}),
    "drift": frozenset({"judge", "speed", "runs", "core", "errors"}),
    "invariance": frozenset({"judge", "engines", "runs", "core", "errors"}),
    "noise": frozenset({"invariance", "judge", "engines", "runs", "core", "errors"}),
    "golden": frozenset({"judge", "engines", "runs", "core", "errors"}),
    "report": frozenset({"judge", "runs", "core", "errors"}),
    "localize": frozenset({"judge", "engines", "runs", "core", "errors"}),
    # the gate imports no feature folder: it reaches each through core/features.py's registry
    "gate": frozenset({"cluster", "shards", "report", "judge", "engines", "runs", "core", "errors"}),
    "nightly": frozenset({"gate", "localize", "report", "drift", "noise", "invariance", "judge", "speed", "engines", "runs",
                          "core", "errors"}),
    "battery": frozenset({"gate", "judge", "engines", "runs", "core", "errors"}),
    "shards": frozenset({"runs", "core", "errors"}),
    "cluster": frozenset({"engines", "runs", "core", "errors"}),
    "fetch": frozenset({"core", "errors"}),
    "face": frozenset({"cluster", "shards", "fetch", "battery", "nightly", "gate", "localize", "report", "drift", "noise",
                       "invariance", "judge", "speed", "golden", "engines", "runs", "core", "errors"}),
}
CORES = frozenset({"speed", "drift", "invariance", "noise", "localize", "golden"})  # the feature folders' cores
# commands above the gate that read a feature's core as a gate would: `check-engine` (localize's
# capture to probe dump), `compare` (the noise profile)
WINGS["check_engine"] = WINGS["gate"] | {"gate"} | CORES
WINGS["offline"] = WINGS["gate"] | {"gate"} | CORES
WINGS["face"] = WINGS["face"] | {"check_engine", "offline"}


# A feature that lives in one folder (docs/architecture.md, "Features"): its core is the wing
# of its name (its row above); its face, the modules named here (its gate hook, its section in
# each format, its command), is a wing of its own, "<feature>.face", above gate/ and report/.
# Only the CLI imports a face; core/features.py's registry reaches it by "module:attr", imported
# when a gate or a writer first asks.
FACES: dict[str, frozenset[str]] = {
    "speed": frozenset({"bench", "feature", "render", "timed_tokens", "view"}),
    "noise": frozenset({"command", "feature", "render"}),
    "drift": frozenset({"feature", "render"}),
    "invariance": frozenset({"feature", "phase", "render"}),
    "localize": frozenset({"feature", "next_step", "phase", "render"}),
    "golden": frozenset({"command", "feature", "render"}),
}
WINGS.update({f"{feature}.face": WINGS["gate"] | {"gate"} | CORES for feature in FACES})
WINGS["face"] = WINGS["face"] | {f"{feature}.face" for feature in FACES}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def wing_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in {"cli", "__init__"}:
        return "face"
    if len(parts) > 2 and parts[2] in FACES.get(parts[1], ()):
        return f"{parts[1]}.face"
    return parts[1] if parts[1] in WINGS else "face"


def imports(root: Path) -> dict[str, list[tuple[str, int, bool]]]:
    """module -> [(imported strict_gate module, line, at module top level)]. `from pkg import sub`
    is an import of the module pkg.sub (a feature's face is a module of its folder)."""
    modules = {module_name(p, root) for p in root.rglob("*.py")}
    out: dict[str, list[tuple[str, int, bool]]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        mod = module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(root.name):
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules
                for dep in sorted(subs) or [node.module]:
                    out[mod].append((dep, node.lineno, id(node) in top))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(root.name + "."):
                        out[mod].append((alias.name, node.lineno, id(node) in top))
    return out


def violations(root: Path) -> list[str]:
    found = []
    for mod, deps in imports(root).items():
        src = wing_of(mod)
        for dep, line, _ in deps:
            dst = wing_of(dep)
            inside_cli = mod.startswith(f"{root.name}.cli.")  # cli/__main__.py runs the app
            if dst == "face" and dep.split(".")[-1] == "cli" and not inside_cli:
                found.append(f"{mod}:{line} imports the CLI ({dep})")
            elif dst != src and dst not in WINGS[src]:
                found.append(f"{mod}:{line}: wing {src!r} may not import {dst!r} ({dep})")
    return found


def top_level_cycles(root: Path) -> list[list[str]]:
    graph = {m: {d for d, _, top in deps if top and d != m} for m, deps in imports(root).items()}
    cycles, state = [], {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d] if d in stack else [m, d])
            elif d not in state:
                visit(d, [*stack, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def file_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports, at any depth: top level, inside functions,
    under TYPE_CHECKING. `from pkg import sub` is an import of the module pkg.sub."""
    modules = {module_name(p, root) for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        mod = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(root.name):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    graph[mod].add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[mod].update(a.name for a in node.names if a.name.startswith(root.name + "."))
        graph[mod].discard(mod)
    return graph


def file_cycles(root: Path) -> list[list[str]]:
    """Every set of files that import each other, directly or round a loop (Tarjan's strongly
    connected components of file_graph, the ones with more than one file)."""
    graph = file_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_wing_table_is_acyclic():
    order: list[str] = []
    pending = dict(WINGS)
    while pending:
        ready = [w for w, deps in pending.items() if deps <= set(order)]
        assert ready, f"the wing table has a cycle among {sorted(pending)}"
        order.extend(sorted(ready))
        for w in ready:
            del pending[w]


def test_every_subpackage_is_a_wing():
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    packages -= {"cli"}  # the face: wing_of maps strict_gate.cli.* to it
    assert packages <= set(WINGS), f"packages without a row in WINGS: {sorted(packages - set(WINGS))}"


def test_imports_point_one_way():
    assert violations(PACKAGE) == []


def test_no_import_cycles_at_module_level():
    assert top_level_cycles(PACKAGE) == []


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("core/files.py", "from strict_gate.runs.records import Record\n"),
        ("runs/audit.py", "from strict_gate.engines.base import Engine\n"),
        ("judge/compare.py", "from strict_gate.engines.hf import HFEngine\n"),
        ("report/markdown.py", "from strict_gate.gate.run import run_gate\n"),
        ("gate/run.py", "from strict_gate import cli\n"),
        ("engines/hf.py", "    from strict_gate.judge.compare import Status\n"),  # a lazy import counts
        ("gate/run.py", "from strict_gate.noise.feature import Noise\n"),  # a feature's face, below it
        ("report/sections.py", "    from strict_gate.noise import render\n"),  # `from pkg import module`
        ("noise/band.py", "from strict_gate.noise.render import SECTION\n"),  # a feature's core, its own face
        ("judge/result.py", "from strict_gate.drift.measure import DriftReport\n"),  # the judge, a feature above it
        ("report/markdown.py", "from strict_gate.drift.render import SECTION\n"),
        ("noise/measure.py", "from strict_gate.invariance.phase import invariance_phase\n"),  # a core, another's face
        ("judge/result.py", "from strict_gate.speed.view import SpeedView\n"),  # the judge, speed's face (its core it may)
        ("gate/run.py", "    from strict_gate.speed.bench import run_bench\n"),
        ("gate/config.py", "from strict_gate.speed.config import SpeedConfig\n"),  # the gate, a feature's core
        ("gate/rewrite.py", "    from strict_gate.invariance.load import load_invariance\n"),
        ("judge/result.py", "from strict_gate.speed.model import SpeedResult\n"),  # the judge, a feature's core
        ("report/markdown.py", "from strict_gate.noise.annotate import NoiseJudgement\n"),
        ("localize/run.py", "    from strict_gate.localize.render import text_lines\n"),  # a core, its own face
    ],
)
def test_an_upward_import_is_caught(tmp_path, where, line):
    copy = tmp_path / "strict_gate"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("models", "__pycache__"))
    target = copy / where
    text = target.read_text(encoding="utf-8")
    if line.startswith(" "):
        text += "\n\ndef _planted():\n" + line
    else:
        text += "\n" + line
    target.write_text(text, encoding="utf-8")
    assert violations(copy), f"{line.strip()} in {where} was not reported"


def test_every_face_is_a_module_of_its_feature():
    missing = [f"{feature}/{name}.py" for feature, names in FACES.items() for name in sorted(names)
               if not (PACKAGE / feature / f"{name}.py").is_file()]
    assert missing == [], f"FACES names modules that are not there: {missing}"


def test_the_registries_reach_the_faces_by_name():
    """FEATURES and SECTIONS are "module:attr" strings, each resolving; the ones in a feature's
    folder name its face (gate/ and report/ import no face: test_imports_point_one_way)."""
    from strict_gate.gate.feature import FEATURES
    from strict_gate.report.sections import SECTIONS

    for spec in FEATURES + SECTIONS:
        module, _, attr = spec.partition(":")
        assert getattr(importlib.import_module(module), attr) is not None, spec
        feature = module.split(".")[1]
        if feature in FACES:
            assert wing_of(module) == f"{feature}.face", spec


def test_every_part_of_the_one_registry_resolves_in_its_own_folder():
    """core/features.py names each feature's hooks, config parser, section and loader: each resolves,
    and each lives in the folder of its feature (a feature owns all of it)."""
    from strict_gate.core.features import FEATURES, resolve

    assert len({f.name for f in FEATURES}) == len(FEATURES)
    for f in FEATURES:
        for spec in (f.hooks, f.config, f.section, f.load):
            if spec is None:
                continue
            assert resolve(spec) is not None, spec
            assert spec.split(".")[1] == f.name, f"{f.name}: {spec} is outside its folder"


def test_a_cycle_is_caught(tmp_path):
    copy = tmp_path / "strict_gate"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("models", "__pycache__"))
    (copy / "runs" / "records.py").write_text(
        (copy / "runs" / "records.py").read_text(encoding="utf-8") + "\nfrom strict_gate.runs.reader import load_run\n",
        encoding="utf-8",
    )
    assert top_level_cycles(copy)


def test_no_file_imports_itself_round_a_loop():
    """No circles between files, lazy and TYPE_CHECKING imports included: what two files share
    lives in a third that both import (gate/outcome.py, engines/command/options.py, report/style.py)."""
    assert file_cycles(PACKAGE) == []


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("gate/outcome.py", "from strict_gate.gate.run import run_gate\n"),  # a two-file loop
        ("gate/config.py", "    from strict_gate.localize.phase import relocalize\n"),  # lazy, round localize/phase.py
        ("engines/command/options.py",
         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from strict_gate.engines.command.engine import CommandEngine\n"),
        ("report/style.py", "from strict_gate.report import html\n"),  # `from pkg import module`
    ],
)
def test_a_planted_file_cycle_is_caught(tmp_path, where, line):
    copy = tmp_path / "strict_gate"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("models", "__pycache__"))
    target = copy / where
    text = target.read_text(encoding="utf-8")
    text += ("\n\ndef _planted():\n" + line) if line.startswith(" ") else ("\n" + line)
    target.write_text(text, encoding="utf-8")
    cycles = file_cycles(copy)
    assert cycles, f"{line.strip()} in {where} made a cycle that was not reported"
    planted = module_name(target, copy)
    assert any(planted in c for c in cycles)
