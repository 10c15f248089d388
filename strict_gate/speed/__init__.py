"""The speed arm: a matched ladder of TTFT / decode / end-to-end figures for both arms.

`model` holds the result objects every report is written from; `config` parses `[speed]`;
`ladder` picks the rungs and synthesises their prompts; `measure` times engines from outside;
`matched` checks the two arms are configured alike; `bench` runs it in a gate or alone.
"""
