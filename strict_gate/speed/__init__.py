"""The speed arm: a matched ladder of TTFT / decode / end-to-end figures for both arms.

One folder, in two ranks (docs/architecture.md). Its core, which the judge, gate/ and report/
may import: `model` holds the result objects every report is written from; `config` parses
`[speed]`; `ladder` picks the rungs and synthesises their prompts (`text_prompts`, a text-only arm's); `measure` times engines from
outside; `matched` checks the two arms are configured alike; `interval` and `verdict` judge the
figures. Its face, above gate/ and report/, which only the CLI imports and the two registries
reach by name: `feature.py` (the gate's hooks, in gate/feature.py's FEATURES), `bench.py` (the
arm run in a gate or alone, `strict-gate bench`) with `timed_tokens.py` (every timed reply's
tokens checked by the judge's comparator), `view.py` (the section worded once, from report.json's
`speed`) and `render.py` (each format, and its `SECTION` in report/sections.py's SECTIONS).
"""
