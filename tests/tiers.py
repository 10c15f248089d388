"""The slow tier: tests CI leaves out (`-m "not full"`; `STRICT_GATE_TESTS=full bash scripts/test.sh`
runs them). Each is a slower variant of a defence a sibling test keeps in CI, named beside it: the
tier cuts repetition, never a verdict's only test. tests/test_tiers.py holds the list to that: a
listed id that no longer exists fails it, and so does a CI test named here that does not exist or
is itself slow, so the list cannot rot into silence. Figures: docs/install.md, "Tests".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slow:
    """Why CI may leave a test out, and what keeps its defence in CI: test ids (a function's id
    covers its parameters) or acceptance steps of the fast tier, `acceptance:ID`."""

    why: str
    ci: tuple[str, ...]


_DECODE = "tests/test_adversarial_localize_decode.py::"
_LOCALIZE = "tests/test_adversarial_localize.py::"
_GRAFT = ("tests/test_localize_graft_units.py::test_verdicts_wrong_alone_follows_and_unjudged",
          _DECODE + "test_an_engine_that_claims_graft_ops_and_ignores_the_graft_is_refused")

FULL: dict[str, Slow] = {
    # localisation along the decode path against vLLM (CI keeps the prefill-equality and fixture-engine KV-bug tests)
    "tests/test_localize_vllm_decode.py::test_the_gate_with_vllm_against_a_kv_cache_bug_localises_along_both_decode_paths":
        Slow("the same bug through a whole gate",
             ("tests/test_localize_vllm_decode.py::test_a_kv_cache_bug_against_vllm_is_localised_along_both_decode_paths",)),
    "tests/test_localize_vllm_decode.py::test_vllm_decode_dump_with_chunked_prefill_is_one_row_per_decode_step":
        Slow("chunked prefill variant",
             ("tests/test_localize_vllm_decode.py::test_vllm_decode_dump_equals_its_prefill_dump_and_forces_exactly_the_ids",)),
    # hostile decode-mode engines (CI keeps one liar of each family)
    _DECODE + "test_mode_both_reports_both_dumps_side_by_side_in_every_format":
        Slow("both dumps side by side", (_DECODE + "test_mode_decode_localises_a_decode_only_bug_on_both_arms_decode_paths",)),
    _DECODE + "test_a_decode_dump_of_another_path_is_refused_by_name[decode_from_ignored-decode_from ignored]":
        Slow("CI keeps the [decode_positions] liar",
             (_DECODE + "test_a_decode_dump_of_another_path_is_refused_by_name[decode_positions-other positions]",)),
    _DECODE + "test_a_decode_dump_that_does_not_choose_its_token_is_said_not_to_reproduce[decode_copy]":
        Slow("CI keeps the [decode_lies] liar",
             (_DECODE + "test_a_decode_dump_that_does_not_choose_its_token_is_said_not_to_reproduce[decode_lies]",)),
    _DECODE + "test_grafting_at_ops_says_wrong_alone_or_follows[mlp1-layers.1.mlp.up_proj-follows0]":
        Slow("op grafting on planted bugs", _GRAFT),
    _DECODE + "test_grafting_at_ops_says_wrong_alone_or_follows[down1-layers.1.mlp.down_proj-follows1]":
        Slow("as above", _GRAFT),
    _DECODE + "test_grafting_at_ops_along_the_decode_path": Slow("as above, along the decode path", _GRAFT),
    _DECODE + "test_a_bad_mode_is_exit_2_naming_the_option_or_the_file_and_line":
        Slow("bad --mode", ("tests/test_localize_graft_units.py::test_the_mode_and_its_bad_values",)),
    # hostile dumps (CI keeps a test of each rule: the gate-level liars below are repetition)
    _LOCALIZE + "test_item7_localize_one_prompt_raises_only_its_own_errors":
        Slow("one prompt's errors", (_LOCALIZE + "test_item7_a_candidate_that_cannot_dump_is_exit_2_before_the_reference_starts",)),
    _LOCALIZE + "test_item3_a_dump_that_did_not_reproduce_never_reads_every_point_equal[case1]":
        Slow("CI keeps [case0]", (_LOCALIZE + "test_item3_a_dump_that_did_not_reproduce_never_reads_every_point_equal[case0]",)),
    _LOCALIZE + "test_item6_a_dump_of_something_else_is_refused_as_such[positions-the dump is of other positions]":
        Slow("CI keeps [wide], [extra_layer] and the embed-row rule itself",
             (_LOCALIZE + "test_item6_embed_rows_of_other_ids_are_refused_as_such",)),
    _LOCALIZE + "test_item6_a_dump_of_something_else_is_refused_as_such[ids-the dump is of other]":
        Slow("the embed-row rule through a gate", (_LOCALIZE + "test_item6_embed_rows_of_other_ids_are_refused_as_such",)),
    _LOCALIZE + "test_item6_a_dump_of_something_else_is_refused_as_such[zeros-is all zeros]":
        Slow("the all-zeros rule through a gate",
             (_LOCALIZE + "test_a_hostile_dump_is_an_engine_failure_naming_the_rule[zeros-no tensor is all zeros]",)),
    _LOCALIZE + "test_a_decode_dump_that_lies_is_said_not_to_reproduce":
        Slow("the decode liar through the gate",
             (_DECODE + "test_a_decode_dump_that_does_not_choose_its_token_is_said_not_to_reproduce[decode_lies]",)),
    # real engines' slow gates (CI runs each engine's strict gate here and in the acceptance fast tier)
    "tests/test_speculative_vllm.py::test_a_launched_vllm_server_speculating_equals_itself":
        Slow("a launched server", ("tests/test_speculative_vllm.py::test_vllm_offline_speculating_equals_itself_with_its_counters",)),
    "tests/test_llamacpp_engine.py::test_q8_0_gate_fails_with_its_flips_classified":
        Slow("a quantised gate", ("acceptance:llamacpp-f32",)),
    "tests/test_ctranslate2_engine.py::test_int8_gate_fails_with_its_flips_classified":
        Slow("a quantised gate", ("acceptance:ctranslate2-float32",)),
    "tests/test_hf_gate.py::test_bfloat16_candidate_is_classified":
        Slow("a bf16 gate", ("acceptance:demo", "tests/test_newcomer.py::test_a_near_tie_gate_names_a_localize_command_that_runs")),
    "tests/test_kda_gates.py::test_chunk_prefill_gate_matches": Slow("the kda-chunk gate", ("acceptance:kda-chunk",)),
    "tests/test_kda_gates.py::test_recurrent_prefill_gate_is_classified":
        Slow("the kda-recurrent gate and its localisation", ("acceptance:kda-recurrent", "acceptance:kda-recurrent-localize")),
    "tests/test_adversarial_nightly.py::test_item20_the_summary_of_10000_changed_prompts_stays_under_1_mib":
        Slow("a 10,000-prompt size bound",
             ("tests/test_adversarial_nightly.py::test_item20_a_summary_over_the_limit_is_cut_under_it_keeping_its_head",)),
}
