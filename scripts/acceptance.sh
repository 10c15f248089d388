#!/usr/bin/env bash
# The acceptance run (benchmarks/acceptance.py; expectations in benchmarks/acceptance.toml): a
# `git archive` copy of HEAD, every shipped gate run from its root as a user types it, with the
# documented follow-ups (localize, show, nightly twice, gate --resume after a SIGKILL), each checked
# against its row. Needs the installed .venv (and .venvs/, build/ for the engines' rows).
#
#   bash scripts/acceptance.sh                       # the fast tier (what .ci/run runs)
#   bash scripts/acceptance.sh --tier full --out benchmarks/results/acceptance/full
#   bash scripts/acceptance.sh --tier all            # and the real model's K = 5 re-captures (an hour each)
#   bash scripts/acceptance.sh --list --tier full    # the steps, without running them
#
# Exit 0 only when every step met every expectation; 1 otherwise; 2 on a bad table.
# ACCEPTANCE_NICE (default 10) is the niceness it runs at (2 shared cores: stay polite).
set -euo pipefail
cd "$(dirname "$0")/.."
exec nice -n "${ACCEPTANCE_NICE:-10}" .venv/bin/python benchmarks/acceptance.py "$@"
