#!/usr/bin/env bash
# The nightly job, the same on every CI (GitHub Actions calls it from
# .github/workflows/nightly-gate.yml; GitLab, Buildkite or Jenkins call it the same way):
#
#   1. run the gate (by default against the committed vLLM baseline),
#   2. diff tonight's report against the previous night's (found through
#      $NIGHTLY_OUTPUT/history.jsonl, so the CI must restore that directory first),
#   3. write the markdown summary ($NIGHTLY_SUMMARY, and $GITHUB_STEP_SUMMARY when set),
#   4. exit 1 on a failed verdict or a regression, 3 on an incomplete gate, 2 on bad input.
#
# Settings (environment):
#   NIGHTLY_CONFIG   gate config                      (default gates/hf-vs-vllm-fp32.toml)
#   NIGHTLY_OUTPUT   output dir kept night to night   (default nightly-reports)
#   NIGHTLY_SUMMARY  summary file                     (default $NIGHTLY_OUTPUT/summary.md)
#   NIGHTLY_FAIL_ON  regressions that fail the job    (default: strict-gate's, see docs/nightly.md)
#   NIGHTLY_PREVIOUS last night's report, when it is not in $NIGHTLY_OUTPUT's history
#   STRICT_GATE      the command                      (default .venv/bin/strict-gate, else strict-gate)
# Extra arguments are passed to `strict-gate nightly`.
set -euo pipefail

config="${NIGHTLY_CONFIG:-gates/hf-vs-vllm-fp32.toml}"
output="${NIGHTLY_OUTPUT:-nightly-reports}"
summary="${NIGHTLY_SUMMARY:-$output/summary.md}"
if [[ -n "${STRICT_GATE:-}" ]]; then
    read -r -a sg <<<"$STRICT_GATE"
elif [[ -x .venv/bin/strict-gate ]]; then
    sg=(.venv/bin/strict-gate)
else
    sg=(strict-gate)
fi

args=(nightly "$config" --output-dir "$output" --summary "$summary")
[[ -n "${NIGHTLY_FAIL_ON:-}" ]] && args+=(--fail-on "$NIGHTLY_FAIL_ON")
[[ -n "${NIGHTLY_PREVIOUS:-}" ]] && args+=(--previous "$NIGHTLY_PREVIOUS")

mkdir -p "$output"
echo "nightly: ${sg[*]} ${args[*]} $*" >&2
exec "${sg[@]}" "${args[@]}" "$@"
