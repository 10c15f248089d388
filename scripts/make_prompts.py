#!/usr/bin/env python
"""Write strict-gate's prompt sets, deterministically, from the texts below.

    python scripts/make_prompts.py [--out-dir prompts] [--tokenizer strict_gate/models/tiny-llama]

Writes ``smoke.jsonl`` (8 prompts, ids p0..p7) and ``battery-128.jsonl``
(128 prompts, ids ``<category>-NNN``), one JSON object per line:
``{"id": str, "text": str, "tags": [str, ...]}``; the first tag is the
category. All prompts are written by hand here; nothing is random.

With ``--pool`` it also writes ``pool-2k.jsonl`` (the pool ``strict-gate battery build``
chooses from, docs/battery.md) and ``pool-2k.sources.json`` (the sha256 of every input
file): passages of the license texts under /usr/share/common-licenses (group ``legal``),
of the running Python's standard library (source lines, group ``code``; docstrings, group
``docstring``), and seeded templates (``arithmetic``, ``list``, ``json``, ``markdown``).
Nothing is downloaded; the same inputs and the same seed give the same file.

With a tokenizer directory that exists, it also checks every prompt's length
(with ``<s>``) against MAX_TOKENS and that the ``long`` ones are 150-250 tokens,
and prints the counts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path

MAX_TOKENS = 255  # every prompt, <s> included, stays under 256 tokens
LONG_RANGE = (150, 250)

SMOKE = [
    ("p0", "This program is free software; you can redistribute it and/or modify it under the terms of", ["prose", "legal"]),
    ("p1", "The quick brown fox jumps over the lazy dog. Then it", ["prose"]),
    ("p2", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n", ["code", "python"]),
    ("p3", "Question: what is 17 + 25?\nAnswer:", ["arithmetic"]),
    ("p4", "La licence publique générale GNU est une licence de logiciel libre qui", ["multilingual", "fr"]),
    ("p5", "| Name | Licence | Copyleft |\n|------|---------|----------|\n| GPL-3 | `GPL-3.0-only` | yes |\n|", ["markdown", "table"]),
    ("p6", "The licenses in this directory are:\n1. Apache-2.0\n2. Artistic\n3.", ["list"]),
    ("p7", "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO", ["prose", "legal", "caps"]),
]

# (category, text, extra tags). Ids are <category>-NNN, numbered per category
# in the order below.
BATTERY = [
    # ---- prose: general English -------------------------------------------
    ("prose", "Once upon a time, in a small village at the edge of a forest, there lived an old clockmaker who", ["story"]),
    ("prose", "The history of the printing press begins in the fifteenth century, when", ["history"]),
    ("prose", "Dear Ms. Patel,\n\nThank you for your letter of 3 March. I am writing to let you know that", ["letter"]),
    ("prose", "It was raining again. She closed the window, poured a cup of tea, and", ["story"]),
    ("prose", "Photosynthesis is the process by which green plants", ["science"]),
    ("prose", "The committee met on Tuesday to discuss the budget for next year. After a long debate,", ["report"]),
    ("prose", "A good README explains what a project does, how to install it, and", ["technical"]),
    ("prose", "\"Where are you going?\" asked the child. \"To the sea,\" said her grandfather, \"because", ["dialogue"]),
    ("prose", "Everyone", ["single-word"]),
    ("prose", "The", ["single-word"]),
    # ---- prose: license-like legal prose (what the model was trained on) ---
    ("prose", "Everyone is permitted to copy and distribute verbatim copies of this license document, but", ["legal", "verbatim"]),
    ("prose", "Licensed under the Apache License, Version 2.0 (the \"License\"); you may not use this file except in compliance with", ["legal", "verbatim"]),
    ("prose", "Redistribution and use in source and binary forms, with or without modification, are permitted provided that", ["legal", "verbatim"]),
    ("prose", "The licensee shall not sublicense, sell, or otherwise transfer the rights granted under this agreement unless", ["legal"]),
    ("prose", "IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF", ["legal", "caps"]),
    ("prose", "For the purposes of this License, \"Derivative Works\" shall mean any work, whether in Source or Object form, that", ["legal", "verbatim"]),
    ("prose", "You may convey a work based on the Program, or the modifications to produce it from the Program, in the form of source code under the terms of section 4, provided that you also meet all of these conditions:", ["legal", "verbatim"]),
    ("prose", "This Agreement shall be governed by the laws of the State of New York, and any dispute arising under it shall be", ["legal"]),
    ("prose", "The Contributor grants You a non-exclusive, worldwide, royalty-free license to use, reproduce, and", ["legal"]),
    ("prose", "If any provision of this License is held to be invalid or unenforceable, then", ["legal"]),

    # ---- code: Python -----------------------------------------------------
    ("code", "import os\nimport sys\n\n\ndef main(argv):\n    if len(argv) < 2:\n        print(\"usage: tool FILE\", file=sys.stderr)\n        return 2\n", ["python"]),
    ("code", "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n\n    def pop(self):\n", ["python"]),
    ("code", "# Read a CSV file and sum the second column\nimport csv\n\ntotal = 0\nwith open(\"data.csv\", newline=\"\") as f:\n    for row in csv.reader(f):\n", ["python"]),
    ("code", "squares = [x * x for x in range(10) if x % 2 == 0]\nprint(squares)  # ->", ["python"]),
    ("code", "@dataclass(frozen=True)\nclass Point:\n    x: float\n    y: float\n\n    def norm(self) -> float:\n        return", ["python"]),
    ("code", "try:\n    value = int(text)\nexcept ValueError as exc:\n    raise SystemExit(f\"not a number: {text!r}\") from exc\n", ["python"]),
    ("code", "async def fetch(session, url):\n    async with session.get(url) as resp:\n        resp.raise_for_status()\n        return await", ["python"]),
    # ---- code: C ------------------------------------------------------------
    ("code", "#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n    printf(\"Hello, world!\\n\");\n", ["c"]),
    ("code", "/* Copyright (C) 2024 Free Software Foundation, Inc.\n   This file is part of the GNU C Library. */\n\n#include <string.h>\n\nsize_t\nstrlen (const char *s)\n{\n", ["c", "legal"]),
    ("code", "struct node {\n    int value;\n    struct node *next;\n};\n\nstatic void list_free(struct node *head)\n{\n    while (head != NULL) {\n", ["c"]),
    ("code", "for (int i = 0; i < n; ++i) {\n    if (a[i] > max)\n        max = a[i];\n}\nreturn", ["c"]),
    ("code", "#define MIN(a, b) ((a) < (b) ? (a) : (b))\n#define MAX(a, b)", ["c"]),
    # ---- code: shell --------------------------------------------------------
    ("code", "#!/bin/sh\nset -eu\n\nfor f in *.txt; do\n    echo \"processing $f\"\n", ["shell"]),
    ("code", "$ ls -la /usr/share/common-licenses | head -n 5\ntotal 268\ndrwxr-xr-x   2 root root  4096 May 20  2025 .\n", ["shell"]),
    ("code", "grep -rn \"TODO\" src/ | awk -F: '{print $1}' | sort | uniq -c | sort -rn | head", ["shell", "pipes"]),
    ("code", "if [ -z \"${HOME:-}\" ]; then\n    echo \"HOME is not set\" >&2\n    exit 1\nfi\n", ["shell"]),
    ("code", "tar -czf backup-$(date +%Y%m%d).tar.gz ~/Documents && echo 'done' || echo 'failed'", ["shell"]),
    # ---- code: JSON ---------------------------------------------------------
    ("code", "{\"name\": \"strict-gate\", \"version\": \"0.1.0\", \"license\": \"Apache-2.0\", \"dependencies\": [", ["json"]),
    ("code", "{\n  \"model\": \"tiny-llama\",\n  \"temperature\": 0,\n  \"max_tokens\": 16,\n  \"logprobs\": 5,\n  \"prompt\":", ["json"]),
    ("code", "[{\"id\": 1, \"ok\": true}, {\"id\": 2, \"ok\": false}, {\"id\": 3, \"ok\":", ["json"]),
    ("code", "{\"text\": \"line one\\nline two\\ttabbed \\\"quoted\\\" \\u00e9\", \"escaped\":", ["json", "escapes"]),
    ("code", "{\"nested\": {\"a\": {\"b\": {\"c\": [1, 2, {\"d\": null}]}}}, \"empty\": {}, \"list\": [", ["json"]),

    # ---- arithmetic -----------------------------------------------------------
    ("arith", "2 + 2 =", []),
    ("arith", "12 * 12 = 144\n13 * 13 = 169\n14 * 14 =", []),
    ("arith", "1, 2, 3, 4, 5, 6, 7, 8, 9,", ["sequence"]),
    ("arith", "1, 1, 2, 3, 5, 8, 13, 21,", ["sequence"]),
    ("arith", "Compute 365 * 24 = 8760 hours, so one year has 8760 * 60 =", []),
    ("arith", "If a train travels 120 km in 1.5 hours, its average speed is", ["word-problem"]),
    ("arith", "3.14159 * 2 =", ["decimal"]),
    ("arith", "0x1F + 0x01 = 0x20\n0xFF + 0x01 =", ["hex"]),
    ("arith", "-7 - (-3) =", ["negative"]),
    ("arith", "The sum of the first 100 positive integers is 100 * 101 / 2 =", []),
    ("arith", "10% of 250 is 25, and 15% of 250 is", ["percent"]),
    ("arith", "2^10 = 1024, 2^16 = 65536, 2^32 =", ["powers"]),

    # ---- lists / enumerations -----------------------------------------------
    ("list", "Days of the week: Monday, Tuesday, Wednesday,", []),
    ("list", "Shopping list:\n- eggs\n- milk\n- bread\n-", ["bullets"]),
    ("list", "The GNU licenses are:\n1. GPL-1\n2. GPL-2\n3. GPL-3\n4.", ["numbered"]),
    ("list", "a) preamble\nb) definitions\nc) grant of rights\nd)", ["lettered"]),
    ("list", "Steps to install:\n1. Download the archive.\n2. Unpack it.\n3.", ["numbered"]),
    ("list", "Months: January, February, March, April, May, June,", []),
    ("list", "Colours of the rainbow: red, orange, yellow, green,", []),
    ("list", "Section 1. Definitions.\nSection 2. Grant of Copyright License.\nSection 3.", ["legal", "numbered"]),
    ("list", "* Apache-2.0\n* Artistic\n* BSD\n* CC0-1.0\n* GFDL-1.2\n*", ["bullets", "legal"]),
    ("list", "Pros:\n  + fast\n  + simple\nCons:\n  -", ["bullets"]),
    ("list", "A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P,", ["alphabet"]),
    ("list", "Planets in order from the Sun: Mercury, Venus, Earth, Mars,", []),

    # ---- multilingual ---------------------------------------------------------
    ("multi", "Le logiciel est fourni « tel quel », sans garantie d'aucune sorte, et l'auteur", ["fr"]),
    ("multi", "Bonjour ! Je m'appelle Élodie et j'habite à Montréal depuis", ["fr"]),
    ("multi", "Où est la gare, s'il vous plaît ? C'est à côté de", ["fr"]),
    ("multi", "Die Software wird ohne jede ausdrückliche oder implizierte Garantie bereitgestellt, einschließlich", ["de"]),
    ("multi", "Größe, Straße, Übermaß: Die Bäume im Wald sind", ["de"]),
    ("multi", "Guten Morgen! Heute ist das Wetter schön, und wir", ["de"]),
    ("multi", "El software se proporciona «tal cual», sin garantía de ningún tipo, y", ["es"]),
    ("multi", "¿Dónde está la biblioteca? ¡Está al lado del", ["es"]),
    ("multi", "Mañana vamos a la montaña con los niños porque", ["es"]),
    ("multi", "本软件按“原样”提供，不提供任何明示或暗示的保证，包括", ["zh"]),
    ("multi", "今天天气很好，我们去公园散步吧。", ["zh"]),
    ("multi", "自由软件基金会发布了通用公共许可证的第三版，", ["zh"]),
    ("multi", "このソフトウェアは「現状のまま」提供され、いかなる保証もありません。", ["ja"]),
    ("multi", "こんにちは、世界！今日は", ["ja"]),
    ("multi", "東京は日本の首都で、人口は", ["ja"]),
    ("multi", "Программное обеспечение предоставляется «как есть», без каких-либо гарантий,", ["ru"]),
    ("multi", "Привет, мир! Сегодня хорошая погода, и мы", ["ru"]),
    ("multi", "Москва — столица России. Она находится на реке", ["ru"]),
    ("multi", "يتم توفير البرنامج \"كما هو\" دون أي ضمان من أي نوع،", ["ar", "rtl"]),
    ("multi", "مرحبا بالعالم! اليوم الطقس جميل و", ["ar", "rtl"]),
    ("multi", "Mixed: English, français, Deutsch, español, 中文, 日本語, русский, العربية and", ["mixed"]),
    ("multi", "I ❤️ open source 🎉🎉 — licenses 📜 and code 💻", ["emoji"]),
    ("multi", "Status: ✅ build ✅ tests ❌ lint 🚧 docs →", ["emoji", "symbols"]),
    ("multi", "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs up, and", ["emoji", "zwj"]),

    # ---- markdown, pipes, backticks, HTML-like text --------------------------
    ("md", "# Licenses\n\n## Apache-2.0\n\nThe Apache License is a permissive license that", ["headings"]),
    ("md", "| Licence | SPDX | Copyleft |\n|---|---|---|\n| GNU GPL v2 | `GPL-2.0-only` | strong |\n| GNU LGPL v3 | `LGPL-3.0-only` |", ["table", "pipes", "backticks"]),
    ("md", "Use `pip install strict-gate` and then run `strict-gate run --engine vllm`; the flag `--top-k` sets", ["backticks"]),
    ("md", "```python\nprint(\"a | b\")\n```\n\nThe code above prints", ["fence", "pipes"]),
    ("md", "<table>\n  <tr><th>Name</th><th>Value</th></tr>\n  <tr><td>alpha</td><td>", ["html"]),
    ("md", "<p>Copyright &copy; 2024 The Authors. All rights reserved.</p>\n<p>", ["html", "entities"]),
    ("md", "<script>alert('x')</script> is the classic test string; a safe report must", ["html", "injection"]),
    ("md", "**Bold**, *italic*, ~~struck~~, and `code` are the four", ["emphasis", "backticks"]),
    ("md", "> NOTE: this quote contains a pipe | and a backtick ` and an angle bracket < that", ["quote", "pipes", "backticks"]),
    ("md", "- [x] write the tokenizer\n- [ ] train the model\n- [ ]", ["tasklist"]),
    ("md", "See [the GPL](https://www.gnu.org/licenses/gpl-3.0.html) and ![logo](img/logo.png \"the logo\") for", ["links"]),
    ("md", "a|b|c\n-|-|-\n1|2|3\n4|5|", ["table", "pipes"]),
    ("md", "Inline math $a < b$ and HTML <br/> and an escaped pipe \\| in one line, then", ["html", "pipes"]),
    ("md", "``double `backtick` span`` and ```triple``` then", ["backticks"]),
    ("md", "<!-- a comment --> <div class=\"note\" data-x='1'>Text &amp; more &lt;tags&gt;</div>", ["html", "entities"]),
    ("md", "Term\n: Definition of the term, which", ["definition"]),
    ("md", "1. First item\n   ```sh\n   make install\n   ```\n2. Second item\n3.", ["fence", "numbered"]),
    ("md", "Footnote reference[^1].\n\n[^1]: The footnote text says", ["footnote"]),
    ("md", "| Token | Logprob |\n|---|---|\n| `\"\\n\"` | -0.01 |\n| `\" the\"` |", ["table", "pipes", "backticks", "escapes"]),
    ("md", "<pre><code>if (a &lt; b &amp;&amp; c &gt; d) { return 1; }</code></pre>", ["html", "entities"]),

    # ---- edge cases: whitespace, repetition, control-ish text ----------------
    ("edge", "a", ["single-char"]),
    ("edge", "\n", ["whitespace"]),
    ("edge", "    ", ["whitespace"]),
    ("edge", "the the the the the the the the the the the the the the the the", ["repetition"]),
    ("edge", "Tab\tseparated\tvalues\there\nand\ta\tsecond\tline\t", ["whitespace", "tabs"]),
    ("edge", "Trailing spaces at the end   ", ["whitespace"]),
    ("edge", "ALL CAPS TEXT WITH NO PUNCTUATION AND NO END", ["caps"]),
    ("edge", "...!!!???---___***###", ["punctuation"]),
]

LONG = [
    ("long", ["legal"], (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION\n\n"
        "1. Definitions. \"License\" shall mean the terms and conditions for use, reproduction, "
        "and distribution as defined by Sections 1 through 9 of this document. \"Licensor\" shall "
        "mean the copyright owner or entity authorized by the copyright owner that is granting the "
        "License. \"Legal Entity\" shall mean the union of the acting entity and all other entities "
        "that control, are controlled by, or are under common control with that entity. For the "
        "purposes of this definition, \"control\" means (i) the power, direct or indirect, to cause "
        "the direction or management of such entity, whether by"
    )),
    ("long", ["legal"], (
        "Preamble\n\nThe licenses for most software and other practical works are designed to take "
        "away your freedom to share and change the works. By contrast, this license is intended to "
        "guarantee your freedom to share and change all versions of a program, to make sure it "
        "remains free software for all its users. When we speak of free software, we are referring "
        "to freedom, not price. Our licenses are designed to make sure that you have the freedom to "
        "distribute copies of free software (and charge for them if you wish), that you receive "
        "source code or can get it if you want it, that you can change the software or use pieces "
        "of it in new free programs, and that you know you can do these things. To protect your "
        "rights, we need to prevent others from"
    )),
    ("long", ["legal"], (
        "Article 7. Limitation of Liability. Except where prohibited by applicable law, neither party "
        "shall be liable to the other for any indirect, incidental, special, or consequential "
        "damages, including lost profits, loss of data, or interruption of business, arising out of "
        "or relating to this Agreement, even if that party has been advised of the possibility of "
        "such damages. The total liability of the Supplier under this Agreement, whether in "
        "contract, tort, or otherwise, shall not exceed the fees paid by the Customer during the "
        "twelve months before the event giving rise to the claim. Nothing in this Article"
    )),
    ("long", ["prose"], (
        "The lighthouse keeper woke before dawn, as he had every morning for thirty-one years. He "
        "climbed the hundred and twelve steps of the tower, checked the lamp, wiped the salt from "
        "the great lens, and wrote the date in the logbook in his careful, slanting hand. Outside, "
        "the sea was grey and calm, and a line of gulls stood along the wall of the harbour like "
        "soldiers waiting for orders. In the village below, the baker was lighting his ovens and the "
        "first"
    )),
    ("long", ["code", "python"], (
        "import argparse\nimport json\nimport sys\nfrom pathlib import Path\n\n\n"
        "def load_prompts(path: Path) -> list[dict]:\n"
        "    \"\"\"Read one JSON object per line; skip blank lines.\"\"\"\n"
        "    prompts = []\n"
        "    with path.open(encoding=\"utf-8\") as f:\n"
        "        for lineno, line in enumerate(f, 1):\n"
        "            line = line.strip()\n"
        "            if not line:\n"
        "                continue\n"
        "            prompts.append(json.loads(line))\n"
        "    return prompts\n\n\n"
        "def main(argv=None) -> int:\n"
    )),
    ("long", ["code", "c", "legal"], (
        "/*\n * Copyright (c) 1990 The Regents of the University of California.\n"
        " * All rights reserved.\n *\n"
        " * Redistribution and use in source and binary forms, with or without\n"
        " * modification, are permitted provided that the following conditions\n"
        " * are met:\n"
        " * 1. Redistributions of source code must retain the above copyright\n"
        " *    notice, this list of conditions and the following disclaimer.\n"
        " * 2. Redistributions in binary form must reproduce the above copyright\n"
        " *    notice, this list of conditions and the following disclaimer in the\n"
        " *    documentation and/or other materials provided with the distribution.\n"
        " */\n\n#include <stdlib.h>\n\nvoid *\nxmalloc(size_t n)\n{\n    void *p = malloc(n);\n"
        "    if (p == NULL)\n"
    )),
    ("long", ["markdown", "table", "pipes", "backticks"], (
        "## Results\n\n"
        "| Prompt | Engine | Tokens equal | First divergence | Margin (nats) |\n"
        "|---|---|---|---|---|\n"
        "| `prose-001` | vllm | yes | - | - |\n"
        "| `code-003` | vllm | no | step 4 | 0.012 |\n"
        "| `multi-010` | candidate | no | step 0 | 0.000 |\n\n"
        "A divergence at a step whose top-2 margin is below the tolerance is reported as a "
        "near-tie, not a failure. The table above shows that"
    )),
    ("long", ["multilingual", "fr", "legal"], (
        "Ce programme est un logiciel libre ; vous pouvez le redistribuer ou le modifier suivant les "
        "termes de la Licence Publique Générale GNU telle que publiée par la Free Software "
        "Foundation, soit la version 3 de cette licence, soit (à votre gré) toute version "
        "ultérieure. Ce programme est distribué dans l'espoir qu'il sera utile, mais SANS AUCUNE "
        "GARANTIE ; sans même la garantie tacite de"
    )),
    ("long", ["list", "legal"], (
        "The following files are distributed in /usr/share/common-licenses:\n"
        "- Apache-2.0: the Apache License, Version 2.0\n"
        "- Artistic: the Artistic License\n"
        "- BSD: the BSD license of the University of California\n"
        "- GFDL-1.2 and GFDL-1.3: the GNU Free Documentation License\n"
        "- GPL-1, GPL-2 and GPL-3: the GNU General Public License\n"
        "- LGPL-2, LGPL-2.1 and LGPL-3: the GNU Lesser (or Library) General Public License\n"
        "- MPL-1.1 and MPL-2.0: the Mozilla Public License\n\n"
        "The symbolic links GPL, LGPL and GFDL point to"
    )),
    ("long", ["legal"], (
        "6. Conveying Non-Source Forms. You may convey a covered work in object code form under the "
        "terms of sections 4 and 5, provided that you also convey the machine-readable Corresponding "
        "Source under the terms of this License, in one of these ways: a) Convey the object code in, "
        "or embodied in, a physical product (including a physical distribution medium), accompanied "
        "by the Corresponding Source fixed on a durable physical medium customarily used for "
        "software interchange. b) Convey the object code in, or embodied in, a physical product "
        "(including a physical distribution medium), accompanied by a written offer, valid for at "
        "least three years and"
    )),
]


POOL_SEED = 20
LICENSES = Path("/usr/share/common-licenses")
STDLIB_FILES = ("argparse.py", "textwrap.py", "csv.py", "heapq.py", "bisect.py", "fractions.py", "statistics.py",
                "calendar.py", "difflib.py", "shutil.py", "tarfile.py", "base64.py", "queue.py", "sched.py",
                "shlex.py", "glob.py", "fnmatch.py", "gettext.py", "colorsys.py", "quopri.py", "ftplib.py",
                "smtplib.py", "imaplib.py", "poplib.py", "pprint.py", "reprlib.py", "selectors.py", "socketserver.py")
WORD_RANGE = (12, 40)  # words per prose passage
LINE_RANGE = (3, 12)  # lines per code passage
MAX_CODE_CHARS = 300
QUOTAS = {"legal": 700, "code": 450, "docstring": 350}  # passages kept per group (a seeded sample, in order)  # the tiny tokenizer spends ~2 chars a token on code: stay under MAX_TOKENS


def _passages(words: list[str], rng, lo: int, hi: int) -> list[str]:
    out, i = [], 0
    while i + lo <= len(words):
        n = rng.randint(lo, hi)
        out.append(" ".join(words[i:i + n]))
        i += n
    return out


def _license_rows(rng, inputs: dict) -> list[dict]:
    rows = []
    for path in sorted(LICENSES.iterdir(), key=lambda q: q.name):
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        inputs[str(path)] = hashlib.sha256(data).hexdigest()
        for k, text in enumerate(_passages(data.decode("utf-8", "replace").split(), rng, *WORD_RANGE)):
            rows.append({"id": f"legal-{path.name}-{k + 1:04d}", "text": text, "tags": ["legal", path.name]})
    return rows


def _stdlib_rows(rng, inputs: dict) -> list[dict]:
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for name in STDLIB_FILES:
        path = root / name
        data = path.read_bytes()
        inputs[str(path)] = hashlib.sha256(data).hexdigest()
        src = data.decode("utf-8")
        lines = [ln for ln in src.splitlines() if ln.strip()]
        i, k = 0, 0
        while i + LINE_RANGE[0] <= len(lines):
            n = rng.randint(*LINE_RANGE)
            text = "\n".join(lines[i:i + n])[:MAX_CODE_CHARS] + "\n"
            i += n
            k += 1
            rows.append({"id": f"code-{path.stem}-{k:04d}", "text": text, "tags": ["code", "python", path.stem]})
        docs = [ast.get_docstring(node) for node in ast.walk(ast.parse(src))
                if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
        words = " ".join(d for d in docs if d).split()
        for j, text in enumerate(_passages(words, rng, *WORD_RANGE)):
            rows.append({"id": f"doc-{path.stem}-{j + 1:04d}", "text": text, "tags": ["docstring", path.stem]})
    return rows


OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}


def _template_rows(rng) -> list[dict]:
    rows = []
    for k in range(300):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*"])
        shown = rng.randint(0, 3)
        lines = []
        for _ in range(shown):
            x, y = rng.randint(0, 99), rng.randint(0, 99)
            lines.append(f"{x} {op} {y} = {OPS[op](x, y)}")
        lines.append(f"{a} {op} {b} =")
        rows.append({"id": f"arith-{k + 1:04d}", "text": "\n".join(lines), "tags": ["arithmetic"]})
    words = ["apple", "licence", "section", "copy", "source", "work", "notice", "program", "library", "author"]
    for k in range(200):
        start, step = rng.randint(0, 50), rng.randint(1, 9)
        if k % 2:
            items = [str(start + step * i) for i in range(rng.randint(3, 9))]
            text = ", ".join(items) + ","
        else:
            items = rng.sample(words, rng.randint(2, 6))
            text = "\n".join(f"{i + 1}. {w}" for i, w in enumerate(items)) + f"\n{len(items) + 1}."
        rows.append({"id": f"list-{k + 1:04d}", "text": text, "tags": ["list"]})
    for k in range(150):
        keys = rng.sample(["name", "version", "license", "id", "ok", "count", "path", "tags"], rng.randint(1, 4))
        body = ", ".join(f'"{key}": {rng.randint(0, 99)}' for key in keys)
        rows.append({"id": f"json-{k + 1:04d}", "text": "{" + body + ', "' + rng.choice(words) + '":',
                     "tags": ["json"]})
    for k in range(150):
        cols = rng.sample(["Name", "Licence", "SPDX", "Copyleft", "Year", "Version"], rng.randint(2, 4))
        head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
        cells = "| " + " | ".join(rng.choice(words) for _ in cols) + " |\n|"
        rows.append({"id": f"md-{k + 1:04d}", "text": head + cells, "tags": ["markdown", "table"]})
    return rows


def build_pool() -> tuple[list[dict], dict]:
    """The battery pool and the sha256 of each input file; seeded, no downloads."""
    import random

    rng = random.Random(POOL_SEED)
    inputs: dict[str, str] = {}
    rows = _license_rows(rng, inputs) + _stdlib_rows(rng, inputs) + _template_rows(rng)
    seen, out = set(), []
    for r in rows:  # dedup on the whitespace-collapsed, case-folded text
        key = " ".join(r["text"].split()).casefold()
        if key not in seen:
            seen.add(key)
            out.append(r)
    return _thin(out, rng), inputs


def _thin(rows: list[dict], rng) -> list[dict]:
    """At most QUOTAS[group] rows of a group, a seeded sample kept in file order."""
    keep: set[str] = set()
    for group, quota in QUOTAS.items():
        ids = [r["id"] for r in rows if r["tags"][0] == group]
        keep.update(rng.sample(ids, min(quota, len(ids))))
    return [r for r in rows if r["tags"][0] not in QUOTAS or r["id"] in keep]


def build_battery() -> list[dict]:
    counters: dict[str, int] = {}
    rows = []
    for cat, text, extra in BATTERY:
        counters[cat] = counters.get(cat, 0) + 1
        rows.append({"id": f"{cat}-{counters[cat]:03d}", "text": text,
                     "tags": [_cat_tag(cat)] + list(extra)})
    for cat, extra, text in LONG:
        counters[cat] = counters.get(cat, 0) + 1
        rows.append({"id": f"{cat}-{counters[cat]:03d}", "text": text, "tags": ["long"] + list(extra)})
    return rows


def _cat_tag(cat: str) -> str:
    return {"arith": "arithmetic", "multi": "multilingual", "md": "markdown"}.get(cat, cat)


def build_smoke() -> list[dict]:
    return [{"id": i, "text": t, "tags": list(tags)} for i, t, tags in SMOKE]


def validate(rows: list[dict], expect: int) -> None:
    assert len(rows) == expect, (len(rows), expect)
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids), "duplicate ids"
    for r in rows:
        assert isinstance(r["id"], str) and r["id"], r
        assert isinstance(r["text"], str) and r["text"], r
        assert r["tags"] and all(isinstance(t, str) and t for t in r["tags"]), r


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    # read back: every line is valid JSON and round-trips
    back = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert back == rows


def check_lengths(tok_dir: Path, sets: dict[str, list[dict]]) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    bad = 0
    for name, rows in sets.items():
        lens = []
        for r in rows:
            n = len(tok(r["text"]).input_ids)  # <s> included
            lens.append(n)
            if n > MAX_TOKENS:
                print(f"  {name} {r['id']}: {n} tokens > {MAX_TOKENS}", file=sys.stderr)
                bad += 1
            if "long" in r["tags"] and not (LONG_RANGE[0] <= n <= LONG_RANGE[1]):
                print(f"  {name} {r['id']}: long prompt has {n} tokens, outside {LONG_RANGE}", file=sys.stderr)
                bad += 1
        longs = sorted(n for r, n in zip(rows, lens) if "long" in r["tags"])
        print(f"{name}: {len(rows)} prompts, tokens (with <s>) min {min(lens)} max {max(lens)} "
              f"total {sum(lens)}" + (f"; long ones {longs}" if longs else ""))
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default="prompts", type=Path)
    ap.add_argument("--tokenizer", default="strict_gate/models/tiny-llama", type=Path,
                    help="check token counts with this tokenizer if it exists")
    ap.add_argument("--pool", action="store_true", help="also write pool-2k.jsonl (docs/battery.md)")
    args = ap.parse_args(argv)

    smoke, battery = build_smoke(), build_battery()
    validate(smoke, 8)
    validate(battery, 128)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out_dir / "smoke.jsonl", smoke)
    write_jsonl(args.out_dir / "battery-128.jsonl", battery)
    print(f"wrote {args.out_dir / 'smoke.jsonl'} and {args.out_dir / 'battery-128.jsonl'}")
    sets = {"smoke": smoke, "battery-128": battery}
    if args.pool:
        pool, inputs = build_pool()
        assert len(pool) >= 2000, len(pool)
        validate(pool, len(pool))
        write_jsonl(args.out_dir / "pool-2k.jsonl", pool)
        (args.out_dir / "pool-2k.sources.json").write_text(json.dumps(
            {"seed": POOL_SEED, "python": platform.python_version(), "inputs": inputs,
             "command": "python scripts/make_prompts.py --pool"}, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {args.out_dir / 'pool-2k.jsonl'} ({len(pool)} prompts) and its sources")
        sets["pool-2k"] = pool
    if (args.tokenizer / "tokenizer.json").exists():
        return 1 if check_lengths(args.tokenizer, sets) else 0
    print(f"(no tokenizer at {args.tokenizer}; lengths not checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
