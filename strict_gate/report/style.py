"""The HTML reports' one style sheet, shared by report.html and invariance.html, and the console's
verdict colours, shared by the console table and the speed section (its own module so that no
writer imports another for them)."""

CONSOLE_STYLE = {"pass": "bold green", "fail": "bold red", "incomplete": "bold yellow", "informational": "bold",
                 "not_comparable": "bold red", "tokens_not_verified": "bold red"}

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#1f2328;font-size:14px}
main{padding:0 2em 2em}
.banner{padding:14px 2em;color:#fff;font-size:1.5em;font-weight:600}
.figs{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.fig{border:1px solid #d0d7de;border-radius:6px;padding:6px 12px;min-width:110px}
.fig b{display:block;font-size:1.4em}
table{border-collapse:collapse}
td,th{border:1px solid #d0d7de;padding:3px 6px;font-size:13px;vertical-align:top;text-align:left}
.strip{display:inline-flex;gap:1px}
.strip i{display:inline-block;width:9px;height:16px}
.m{background:#2da44e}.t{background:#d4a72c}.d{background:#cf222e}.a{background:#afb8c1}
.strip i:hover{outline:2px solid #0969da}
.chip{display:inline-block;margin:1px;padding:1px 4px;border-radius:4px;font-family:ui-monospace,monospace;
white-space:pre;font-size:12px}
.chip.m{background:#dafbe1}.chip.t{background:#d4a72c;color:#000;font-weight:bold}
.chip.d{background:#cf222e;color:#fff;font-weight:bold}.chip.a{background:#eaeef2;color:#57606a}
.chips b{display:inline-block;width:80px}
.st{font-size:12px;padding:1px 6px;border-radius:8px;background:#eaeef2}
.st.near_tie{background:#fff8c5}.st.divergent,.st.not_greedy,.st.length_mismatch{background:#ffebe9}
.tops{display:flex;gap:24px;margin:6px 0}.topk table td{font-family:ui-monospace,monospace;white-space:pre}
tr.rt td{background:#dafbe1}tr.ct td{background:#ffebe9}
section.prompt{border-top:1px solid #d0d7de;margin-top:12px}
.texts{display:grid;grid-template-columns:1fr 1fr 1fr;gap:10px}
pre{background:#f6f8fa;padding:6px;white-space:pre-wrap;word-break:break-all;margin:2px 0}
.none{color:#6e7781}.why{color:#57606a}
svg.trend text{font-size:11px;fill:#57606a}svg.trend .grid{stroke:#d0d7de}
svg.trend polyline{fill:none;stroke-width:2}svg .exact,.legend .exact{stroke:#0969da;color:#0969da}
svg .pos,.legend .pos{stroke:#8250df;color:#8250df}
.speedv{font-weight:600}.speedv.pass{color:#1a7f37}.speedv.fail,.speedv.not_comparable,.speedv.tokens_not_verified{color:#cf222e}.speedv.incomplete{color:#9a6700}
.flat{color:#cf222e;font-weight:600}td.ns{background:#fff8c5}
"""
