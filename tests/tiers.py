"""The slow tier: tests CI leaves out (`-m "not full"`; `STRICT_GATE_TESTS=full bash scripts/test.sh`
runs them). Each is a slower variant of a defence a sibling test keeps in CI, named beside it: the
tier cuts repetition, never a verdict's only test. A listed id that no longer exists fails
tests/test_tiers.py, so the list cannot rot into silence. Figures: docs/install.md, "Tests".
"""

FULL: dict[str, str] = {
    # localisation along the decode path against vLLM (CI keeps the prefill-equality and fixture-engine KV-bug tests)
    "tests/test_localize_vllm_decode.py::test_the_gate_with_vllm_against_a_kv_cache_bug_localises_along_both_decode_paths":
        "the same bug through a whole gate; CI: test_a_kv_cache_bug_against_vllm_is_localised_along_both_decode_paths",
    "tests/test_localize_vllm_decode.py::test_vllm_decode_dump_with_chunked_prefill_is_one_row_per_decode_step":
        "chunked prefill variant; CI: test_vllm_decode_dump_equals_its_prefill_dump_and_forces_exactly_the_ids",
    # hostile decode-mode engines (CI keeps one liar of each family)
    "tests/test_adversarial_localize_decode.py::test_mode_both_reports_both_dumps_side_by_side_in_every_format":
        "both dumps side by side; CI: test_mode_decode_localises_a_decode_only_bug_on_both_arms_decode_paths",
    "tests/test_adversarial_localize_decode.py::test_a_decode_dump_of_another_path_is_refused_by_name[decode_from_ignored-decode_from ignored]":
        "CI keeps the [decode_positions] liar",
    "tests/test_adversarial_localize_decode.py::test_a_decode_dump_that_does_not_choose_its_token_is_said_not_to_reproduce[decode_copy]":
        "CI keeps the [decode_lies] liar",
    "tests/test_adversarial_localize_decode.py::test_grafting_at_ops_says_wrong_alone_or_follows[mlp1-layers.1.mlp.up_proj-follows0]":
        "op grafting on planted bugs; CI: tests/test_localize_graft_units.py and the graft_ops liar",
    "tests/test_adversarial_localize_decode.py::test_grafting_at_ops_says_wrong_alone_or_follows[down1-layers.1.mlp.down_proj-follows1]":
        "as above",
    "tests/test_adversarial_localize_decode.py::test_grafting_at_ops_along_the_decode_path":
        "as above, along the decode path",
    "tests/test_adversarial_localize_decode.py::test_a_bad_mode_is_exit_2_naming_the_option_or_the_file_and_line":
        "bad --mode; CI: tests/test_localize_units.py checks the option's parsing",
    # hostile dumps (CI keeps two of the five item-6 liars and one of each other family)
    "tests/test_adversarial_localize.py::test_item7_localize_one_prompt_raises_only_its_own_errors":
        "CI: test_item7_a_candidate_that_cannot_dump_is_exit_2_before_the_reference_starts",
    "tests/test_adversarial_localize.py::test_item3_a_dump_that_did_not_reproduce_never_reads_every_point_equal[case1]":
        "CI keeps [case0]",
    "tests/test_adversarial_localize.py::test_item6_a_dump_of_something_else_is_refused_as_such[positions-the dump is of other positions]":
        "CI keeps [wide] and [extra_layer]",
    "tests/test_adversarial_localize.py::test_item6_a_dump_of_something_else_is_refused_as_such[ids-the dump is of other]":
        "as above",
    "tests/test_adversarial_localize.py::test_item6_a_dump_of_something_else_is_refused_as_such[zeros-is all zeros]":
        "as above",
    "tests/test_adversarial_localize.py::test_a_decode_dump_that_lies_is_said_not_to_reproduce":
        "CI: tests/test_adversarial_localize_decode.py's [decode_lies]",
    # real engines' slow gates (CI runs each engine's strict gate here and in the acceptance fast tier)
    "tests/test_speculative_vllm.py::test_a_launched_vllm_server_speculating_equals_itself":
        "CI: test_vllm_offline_speculating_equals_itself_with_its_counters",
    "tests/test_llamacpp_engine.py::test_q8_0_gate_fails_with_its_flips_classified":
        "CI: the llamacpp-f32 gate (acceptance fast tier) and this file's other tests",
    "tests/test_ctranslate2_engine.py::test_int8_gate_fails_with_its_flips_classified":
        "CI: the ctranslate2-float32 gate (acceptance fast tier) and this file's other tests",
    "tests/test_hf_gate.py::test_bfloat16_candidate_is_classified":
        "CI: the demo (hf bf16, acceptance fast tier) and tests/test_newcomer.py",
    "tests/test_kda_gates.py::test_chunk_prefill_gate_matches":
        "CI: the kda-chunk gate in the acceptance fast tier",
    "tests/test_kda_gates.py::test_recurrent_prefill_gate_is_classified":
        "CI: the kda-recurrent gate and its localisation in the acceptance fast tier",
    "tests/test_adversarial_nightly.py::test_item20_the_summary_of_10000_changed_prompts_stays_under_1_mib":
        "a 10,000-prompt size bound; CI keeps the other summary items",
}
