"""vLLM's decode-path dump distrusts what comes back (issue 27): forced tokens other than the ids
given, forward passes that are not one row per decode step (a cached prefix skipped, a batch of
steps), an engine that cannot force (speculative decoding), a decode_from outside the ids; and
the forcing logits processor leaves every row it was not asked to force untouched.

No vLLM engine runs here: the checks are the engine's own functions fed lying inputs, and the
processor is vLLM's class API driven with vLLM's own BatchUpdate (the real engine runs in
tests/test_localize_vllm_decode.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, VLLM_OPTIONS

from strict_gate.engines.base import DumpRequest
from strict_gate.engines.vllm.dump import FORCE, _check_decode, _decode_logits, run
from strict_gate.errors import EngineError

IDS = list(range(10, 20))


@pytest.mark.parametrize(("generated", "calls", "words"), [
    ([10, 11, 12, 13, 99, 15], [6, 1, 1, 1, 1], "did not hold"),          # a forced id not taken
    ([16, 17], [6, 1, 1], "did not hold"),                                  # stopped early
    ([16, 17, 18, 19, 5], [4, 1, 1, 1, 1], "forward passes ran"),           # a cached prefix skipped
    ([16, 17, 18, 19, 5], [6, 2, 1, 1], "forward passes ran"),              # two decode steps in one pass
    ([16, 17, 18, 19, 5], [6, 1, 1, 1], "forward passes ran"),              # a step missing
    ([16, 17, 18, 19, 5], [6, 1, 1, 1, 1, 1], "forward passes ran"),        # a step too many
    ([16, 17, 18, 19, 5], [10], "forward passes ran"),                      # all of it as prefill
])
def test_a_decode_dump_that_did_not_take_the_decode_path_is_refused(generated, calls, words):
    with pytest.raises(EngineError, match=words):
        _check_decode(IDS, 6, generated, calls)


def test_an_honest_decode_dump_passes_in_chunks_too():
    _check_decode(IDS, 6, [16, 17, 18, 19, 5], [6, 1, 1, 1, 1])
    _check_decode(IDS, 6, [16, 17, 18, 19, 5], [4, 2, 1, 1, 1, 1])  # chunked prefill: 4 + 2


def test_logits_only_where_every_kept_position_is_a_sampled_row():
    import torch

    raw = {s: torch.full((3,), float(s)) for s in range(5)}  # steps 0..4: positions 5..9
    assert _decode_logits(raw, 6, (4, 5)) is None  # position 4 is a prompt row: no logits at all
    assert _decode_logits(raw, 6, (5, 9))[:, 0].tolist() == [0.0, 4.0]
    assert _decode_logits({0: raw[0]}, 6, (5, 6)) is None  # a step the processor never saw


def test_decode_from_outside_the_ids_is_refused_before_vllm_is_asked():
    pytest.importorskip("vllm")
    for n0 in (0, len(IDS) + 1):
        with pytest.raises(EngineError, match="outside"):
            run(None, DumpRequest(tuple(IDS), None, (1,), Path("d"), decode_from=n0))


def test_speculative_vllm_cannot_dump_along_decode():
    """vLLM refuses custom logits processors with speculative decoding: not claimed, refused."""
    from strict_gate.engines.speculative import Speculation
    from strict_gate.engines.vllm.engine import VLLMEngine, VLLMOptions

    plain = VLLMEngine(VLLMOptions(**VLLM_OPTIONS), base_dir=ROOT)
    assert plain.can_dump_decode and "logits_processors" not in plain.llm_kwargs()
    spec = plain.with_speculative(Speculation("ngram", 3, prompt_lookup_max=4))
    assert not spec.can_dump_decode
    with pytest.raises(EngineError, match="speculative"):
        spec.dump(DumpRequest(tuple(IDS), None, (1,), Path("d"), decode_from=6))


def test_the_processor_forces_only_the_rows_asked_and_only_while_ids_remain():
    pytest.importorskip("vllm")
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality

    from strict_gate.engines.vllm.dump import PROCESSOR
    from strict_gate.engines.vllm.force import ForceIds

    assert f"{ForceIds.__module__}:{ForceIds.__qualname__}" == PROCESSOR  # the name vllm.LLM is given
    proc = ForceIds(None, torch.device("cpu"), False)
    assert proc.is_argmax_invariant() is False
    forced_out: list[int] = []
    plain = SamplingParams(temperature=0.0)
    proc.update_state(BatchUpdate(3, (), ((0, plain, [1], []), (1, SamplingParams(
        temperature=0.0, extra_args={FORCE: [7, 3]}), [1], forced_out), (2, SamplingParams(temperature=0.0), [1], [])),
        ()))
    logits = torch.randn(3, 10)
    before = logits.clone()
    out = proc.apply(logits)
    assert torch.equal(out[0], before[0]) and torch.equal(out[2], before[2])
    assert out[1].argmax().item() == 7 and out[1][7] == before[1][7] and torch.isinf(out[1]).sum() == 9
    forced_out.append(7)
    assert proc.apply(before.clone())[1].argmax().item() == 3
    forced_out.append(3)  # past the forced ids: untouched
    assert torch.equal(proc.apply(before.clone()), before)
    forced_out[:] = [7]
    proc.update_state(BatchUpdate(3, (), (), ((1, 2, MoveDirectionality.SWAP),)))  # the forced row moves to 2
    out = proc.apply(before.clone())
    assert out[2].argmax().item() == 3 and torch.equal(out[1], before[1])
    proc.update_state(BatchUpdate(2, (2,), (), ()))  # removed: nothing forced any more
    assert torch.equal(proc.apply(before.clone()), before)
