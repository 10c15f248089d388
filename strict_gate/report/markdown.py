"""report.md: what a reviewer reads first. Verdict line first, then the numbers, then the why."""

from __future__ import annotations

from strict_gate.judge.compare import Status
from strict_gate.judge.prefix_drift import FLOAT32_ROUNDING_MAX, HALF_PRECISION_MAX, DriftScale
from strict_gate.judge.result import GateResult, arm_wall_clock, matched_drift, status_label, verdict_heading
from strict_gate.judge.tally import headline
from strict_gate.report.gaps import LEGEND, gap_cells
from strict_gate.report.missing import listed, missing_lines
from strict_gate.report.sections import in_order
from strict_gate.report.text import Decoder, around, gate_decoder, md, show_token
from strict_gate.runs.records import TopK


def _gap(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _top(dec: Decoder, top: TopK | None, before: list[int], n: int = 5) -> str:
    if not top:
        return "no logprobs"
    return "<br>".join(f"{md(show_token(dec, t, before))} {lp:.3f}" for t, lp in top[:n])


def _context(dec: Decoder, ids, position: int, width: int = 8) -> str:
    return md(dec.tail(ids[:position], width))


def _engine_rows(label: str, info) -> list[str]:
    env = ", ".join(f"{k}={v}" for k, v in sorted(info.env.items())) or "none"
    versions = ", ".join(f"{k} {v}" for k, v in sorted(info.versions.items())) or "unknown"
    opts = ", ".join(
        f"{k}={v}" for k, v in sorted(info.options.items()) if v not in (None, {}, []) and k != "resolved_model"
    )
    return [f"| {label} | {md(info.kind)} | {md(str(info.model))} | {md(opts)} | {md(env)} | {md(versions)} |"]


def trend(history) -> list[str]:
    """The last nights of this gate (history.jsonl), oldest first, tonight last."""
    if len(history) < 2:
        return []
    drift = any(isinstance(e.get("drift"), dict) for e in history)
    out = [f"## Trend (last {len(history)} nights)", ""]
    out.append("| night | verdict | exact | positions | near-tie | divergent |" + (" min ref margin |" if drift else ""))
    out.append("|---|---|---|---|---|---|" + ("---|" if drift else ""))
    for e in history:
        p, pos, c = e.get("prompts") or {}, e.get("positions") or {}, e.get("counts") or {}
        row = (
            f"| {md(str(e.get('time')))} | {md(str(e.get('verdict')))} | {p.get('exact')}/{p.get('total')} "
            f"| {pos.get('matched')}/{pos.get('total')} | {c.get('near_tie', 0)} | {c.get('divergent', 0)} |"
        )
        if drift:
            m = (e.get("drift") or {}).get("min_reference_margin")
            row += f" {'–' if m is None else _gap(m)} |"
        out.append(row)
    out.append("")
    return out


def summary(r: GateResult, dec: Decoder | None = None) -> str:
    """The head of report.md (verdict, figures, why, trend): what a CI job summary shows."""
    return "\n".join(_head(r, gate_decoder(r) if dec is None else dec))


def render(r: GateResult, dec: Decoder | None = None) -> str:
    """report.md; `dec` is the gate's one decoder when the caller already has it (write_reports)."""
    dec = gate_decoder(r) if dec is None else dec
    out = _head(r, dec)
    out += _rest(r, dec)
    return "\n".join(out)


def _head(r: GateResult, dec: Decoder) -> list[str]:
    s = r.comparison.summary
    v = r.verdict
    caveat = v.rule.caveat
    out: list[str] = []
    out.append(
        f"# {verdict_heading(r)}: {md(r.name)} — {s.prompts_exact}/{s.prompts_total} prompts exact, "
        f"{s.positions_matched}/{s.positions_total} positions, policy `{v.policy}`" + (" (one-sided, weaker)" if v.rule.one_sided else "")
    )
    out.append("")
    out.append(f"Verdict **{v.verdict}** under policy **{v.policy}** (near-tie band {v.band} nats)"
               + (f": {caveat}." if caveat else "."))
    out.append("")
    for head in in_order("markdown_head"):  # each section's own line: none changes the token verdict above
        out += head(r)
    out.append("## Summary")
    out.append("")
    out.append("| measure | value |")
    out.append("|---|---|")
    out.append(f"| prompts exact | {s.prompts_exact}/{s.prompts_total} |")
    out.append(f"| positions matched (positionwise) | {s.positions_matched}/{s.positions_total} |")
    out.append(f"| positions matched (prefix) | {s.prefix_positions}/{s.positions_total} |")
    for name, value in headline(s.counts, r.flips):
        out.append(f"| {name} | {value} |")
    for arm, entries in r.resumed.items():
        done = "; ".join(f"at {e.get('at')}, {e.get('kept')} prompts kept" for e in entries)
        out.append(f"| {arm} run resumed | {md(done)} |")
    first = next((p for p in r.comparison.prompts if p.first_divergence is not None), None)
    if first is not None:
        d = first.first_divergence
        assert d is not None  # first was picked for it
        cand = show_token(dec, d.candidate_token, *around(r.candidate_records.get(first.id), d.position))
        ref = show_token(dec, d.reference_token, *around(r.reference_records.get(first.id), d.position))
        out.append(f"| first divergence | {md(first.id)} at position {d.position}: candidate {md(cand)} vs reference {md(ref)} |")
    out.append("")
    out.append("## Why it " + {"pass": "passed", "fail": "failed", "incomplete": "is incomplete"}[v.verdict])
    out.append("")
    for reason in v.reasons:
        out.append(f"- {md(reason)}")
    for note in (*v.notes, *r.notes):
        out.append(f"- note: {md(note)}")
    out.append("")
    out += trend(r.history)
    return out


MD_ROWS = 50  # per table: report.md stays PR-comment sized on a 10,000-prompt gate


def _more(n: int, what: str) -> list[str]:
    return [f"… and {n} more {what}: every one is in report.json and report.html.", ""] if n > 0 else []


def _rest(r: GateResult, dec: Decoder) -> list[str]:
    """Everything below the head, one section after another."""
    return [
        *_mismatches(r, dec),
        *_diagnosis(r),
        *(line for section in in_order("markdown") for line in section(r, dec)),
        *_determinism(r),
        *_engines(r),
        *_wall_clock(r),
        *_problems(r),
        "",
    ]


def _mismatches(r: GateResult, dec: Decoder) -> list[str]:
    """## Prompts that do not match: the missing ones in a line, then one row per other prompt."""
    bad = listed(r.comparison.prompts)
    gone = missing_lines(r.comparison.prompts)
    out: list[str] = []
    if bad or gone:
        out += ["## Prompts that do not match", ""]
        out += [f"- {md(line)}" for line in gone] + ([""] if gone else [])
    if not bad:
        return out
    out.append(
        "| prompt | status | pos | context before | reference | candidate | ref gap | cand gap "
        "| reference top | candidate top |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    out += [_mismatch_row(r, dec, p) for p in bad[:MD_ROWS]]
    out.append("")
    out.append("Gaps are in nats: reference gap = lp_ref(ref token) − lp_ref(cand token) from the reference's")
    out.append("top-k at that step, candidate gap the same on the candidate's side; n/a = the other token is")
    out.append("outside that side's top-k (or no logprobs), which is never a near-tie; " + LEGEND + ".")
    out.append("")
    out += near_tie_scales(r)
    out += _more(len(bad) - MD_ROWS, "non-matching prompts")
    return out


def near_tie_scales(r: GateResult) -> list[str]:
    """How many near-ties came with drift above float32 rounding level, and the thresholds."""
    scales = [pd.scale for p in r.comparison.prompts
              if p.status == Status.NEAR_TIE and (pd := matched_drift(r, p)) is not None]
    above = [s for s in scales if s != DriftScale.FLOAT32_ROUNDING]
    if not above:
        return []
    n_q = sum(1 for s in above if s == DriftScale.BEYOND_HALF_PRECISION)
    return [
        f"{len(above)} of {len(scales)} near-tie(s) came with drift above float32 rounding level at their matched "
        f"positions ({n_q} beyond half precision: max |Δ logprob| > {HALF_PRECISION_MAX:g} nats; the rest at "
        f"half-precision level: > {FLOAT32_ROUNDING_MAX:g}). Such a tie says the arms already disagreed everywhere; the thresholds are "
        "orders of magnitude and depend on the hardware (docs/drift.md).",
        "",
    ]


def _mismatch_row(r: GateResult, dec: Decoder, p) -> str:
    d = p.first_divergence
    if d is None:
        return f"| {md(p.id)} | {status_label(r, p)} | – | {md(p.detail)} | | | | | | |"
    ref = r.reference_records[p.id]
    (rb, ra), (cb, ca) = around(ref, d.position), around(r.candidate_records.get(p.id), d.position)
    return (
        f"| {md(p.id)} | {status_label(r, p)} | {d.position} | {_context(dec, ref.token_ids, d.position)} "
        f"| {md(show_token(dec, d.reference_token, rb, ra))} | {md(show_token(dec, d.candidate_token, cb, ca))} "
        f"| {' | '.join(md(c) for c in gap_cells(d))} "
        f"| {_top(dec, d.reference_top, rb)} | {_top(dec, d.candidate_top, cb)} |"
    )


def _diagnosis(r: GateResult) -> list[str]:
    """## Teacher-forced diagnosis: each divergent prompt re-scored on the candidate's own tokens."""
    if not r.diagnoses:
        return []
    out = ["## Teacher-forced diagnosis", ""]
    out.append(
        f"{md(r.rescored_by or 'The reference engine')} re-scored each divergent prompt on the candidate's "
        "own tokens (teacher forcing): gap = lp(argmax) − lp(candidate token) given the candidate's prefix; "
        "a candidate that can score re-scored the reference's tokens up to the divergence (its gap "
        "lp(candidate token) − lp(reference token)). The diagnosis is the prompt's one classification, from both."
    )
    out.append("")
    out.append("| prompt | pos | decode gap | re-scored gap | candidate re-scored gap | rest downstream? | diagnosis |")
    out.append("|---|---|---|---|---|---|---|")
    for pid, dg in list(r.diagnoses.items())[:MD_ROWS]:
        rescored = "outside top-k" if dg.rescored_gap is None and dg.error is None else _gap(dg.rescored_gap)
        cand = "unknown" if dg.candidate is None or dg.candidate.gap is None else _gap(dg.candidate.gap)
        later = ("yes" if dg.downstream_only else f"no ({len(dg.later_errors)} later error(s))" if dg.later is None
                 else f"no ({dg.later.flip_count} later flip(s), {dg.later.divergent_count} divergent)")
        text = dg.verdict if dg.error is None else f"{dg.verdict}: {dg.error}"
        out.append(f"| {md(pid)} | {dg.position} | {_gap(dg.decode_gap)} | {rescored} | {cand} | {later} "
                   f"| {md(text)} |")
    out.append("")
    out += _more(len(r.diagnoses) - MD_ROWS, "diagnosed prompts")
    return out


def _determinism(r: GateResult) -> list[str]:
    """## Reference determinism: over the K runs a baseline captured, where the reference split."""
    det = r.determinism
    if not det:
        return []
    out = ["## Reference determinism", ""]
    out.append(
        f"{det.get('prompts_deterministic')}/{det.get('prompts_total')} prompts identical over "
        f"{det.get('runs')} runs."
    )
    for nd in det.get("non_deterministic", [])[:20]:
        pos = ", ".join(str(x["position"]) for x in nd["positions"][:10])
        out.append(f"- {md(nd['id'])}: {nd['distinct_sequences']} distinct sequences; differs at {pos}")
    out.append("")
    return out


def _engines(r: GateResult) -> list[str]:
    """## Engines: one row per engine, then the prompt set and sampling both arms ran."""
    out = ["## Engines", "", "| arm | kind | model | options | env | versions |", "|---|---|---|---|---|---|"]
    out += _engine_rows("reference", r.reference)
    out += _engine_rows("candidate", r.candidate)
    if r.rescorer is not None:
        out += _engine_rows("rescorer", r.rescorer)
    out.append("")
    ps = r.prompt_set
    out.append(
        f"Prompt set `{md(str(ps.get('name')))}` ({ps.get('count')} prompts), sha256 `{ps.get('sha256')}`; "
        f"greedy, max_tokens {r.sampling.max_tokens}, top_logprobs {r.sampling.top_logprobs}."
    )
    return out


def _wall_clock(r: GateResult) -> list[str]:
    """Each arm's wall clock in this gate, when its records have timings (not a matched benchmark)."""
    speeds = [(a, arm_wall_clock(x)) for a, x in (("reference", r.reference_records), ("candidate", r.candidate_records))]
    if not any(sp for _, sp in speeds):
        return []
    out = ["", "Wall clock in this gate (not a matched speed benchmark):", ""]
    out.append("| arm | prompts | tokens | seconds | tok/s | median TTFT s |")
    out.append("|---|---|---|---|---|---|")
    for arm, sp in speeds:
        info = r.reference if arm == "reference" else r.candidate
        if "replayed_from" in info.options:
            arm += " (recorded at capture)"
        if sp is None:
            out.append(f"| {arm} | – | – | – | – | – |")
            continue
        tps = "–" if sp.tokens_per_s is None else f"{sp.tokens_per_s:.1f}"
        ttft = "–" if sp.median_ttft_s is None else f"{sp.median_ttft_s:.4f}"
        out.append(f"| {arm} | {sp.prompts} | {sp.tokens} | {sp.seconds:.2f} | {tps} | {ttft} |")
    return out


def _problems(r: GateResult) -> list[str]:
    """## Problems the verdict's reasons do not already list."""
    unsaid = [pr for pr in r.problems if pr not in r.verdict.reasons]
    if not unsaid:
        return []
    return ["", "## Problems", "", *(f"- {md(pr)}" for pr in unsaid)]
