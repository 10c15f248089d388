"""A real git repository for the bisect tests: a small command engine over seven commits.

Commit 2 does not build (a syntax error, caught by BUILD's parse), commit 3 fixes it,
commit 4 flips the third token of prompts p1 and p3 (outside the reference's top-k: a strict
failure), commits 5-7 touch only the README. The reference is the first commit's engine, run
live from a copy outside the repository; the gate config sits outside it too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ENGINE = '''#!/usr/bin/env python
import json
import sys

FLIP = {flip}


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\\n")
    sys.stdout.flush()


send({{"hello": "strict-gate/engine@1", "name": "bisect-engine", "version": "1", "capabilities": ["generate"]}})
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        break
    base = req["prompt_token_ids"][-1]
    toks = [(base + i + 1 + (500 if req["id"] in FLIP and i == 2 else 0)) % 1000 for i in range(req["max_tokens"])]
    k = max(2, req.get("top_logprobs", 2))
    send({{"id": req["id"], "token_ids": toks, "finish_reason": "length",
          "top_logprobs": [[[t, -0.1]] + [[(t + 1 + j) % 1000, -5.0 - j] for j in range(k - 1)] for t in toks]}})
'''
GOOD = ENGINE.format(flip="set()")
FLIPPED = ENGINE.format(flip='{"p1", "p3"}')
BROKEN = GOOD.replace("def send(obj):", "def send(obj:")
PROMPTS = [{"id": f"p{i}", "token_ids": [1, 2 + i, 10 * i + 3]} for i in range(5)]
# a syntax check that writes nothing (py_compile would leave __pycache__ in the repository)
BUILD = f"{sys.executable} -c \"import ast; ast.parse(open('engine.py').read())\""


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def commit(repo: Path, message: str, **files: str) -> str:
    for name, text in files.items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def make_repo(root: Path) -> tuple[Path, list[str]]:
    """The repository (on branch main, at commit 7) and its seven commits, oldest first."""
    repo = root / "engine-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    shas = [commit(repo, "1: the engine", **{"engine.py": GOOD, "README": "v1\n"}),
            commit(repo, "2: a refactor that does not build", **{"engine.py": BROKEN}),
            commit(repo, "3: build fixed", **{"engine.py": GOOD + "# fixed\n"}),
            commit(repo, "4: a faster third token", **{"engine.py": FLIPPED}),
            commit(repo, "5: docs", README="v5\n"),
            commit(repo, "6: docs", README="v6\n"),
            commit(repo, "7: docs", README="v7\n")]
    return repo, shas


def gate_config(root: Path, repo: Path, *, reference: list[str] | None = None, baseline: Path | None = None) -> Path:
    """The gate: the first commit's engine (a copy) as the live reference, or the stored
    `baseline` run, the checkout as candidate."""
    ref = root / "reference_engine.py"
    ref.write_text(GOOD)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    cmd = reference or [sys.executable, str(ref)]
    path = root / "gate.toml"
    path.write_text(
        f'name = "bisect-demo"\nprompts = "{prompts}"\nmax_tokens = 4\ntop_logprobs = 2\npolicy = "strict"\n'
        f'output_dir = "{root / "reports"}"\n'
        + (f'[reference]\nkind = "recorded"\npath = "{baseline}"\n' if baseline else
           f"[reference]\nkind = \"command\"\ncommand = {json.dumps(cmd)}\n")
        + f"[candidate]\nkind = \"command\"\ncommand = {json.dumps([sys.executable, str(repo / 'engine.py')])}\n")
    return path
