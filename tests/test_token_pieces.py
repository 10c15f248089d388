"""Token pieces that are part of a multi-byte character (byte-level BPE: SmolLM2-135M, the
bundled tiny-llama) print as <0xE6><0x80>, never as a Python bytes escape (\\xe6\\x80) or a lone
U+FFFD; a run of tokens is joined into bytes before decoding, so a character split over tokens
prints whole (report/pieces.py, report/text.py's Decoder)."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path

from helpers import smollm2_converted
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt  # comes with rich
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.report.pieces import readable
from strict_gate.report.text import Decoder

ROOT = Path(__file__).resolve().parent.parent
PY_ESCAPE = re.compile(r"\\x[89a-fA-F][0-9a-fA-F]")  # a byte >= 0x80 written as Python writes it
NOTATION = re.compile(r"<0x[0-9A-F]{2}>")
# Any text a UTF-8 file can hold, but a U+FFFD of its own (control characters keep \x1b, \u0085 escapes).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\ufffd"), max_size=40)
TINY = Decoder("bundled:tiny-llama")


@settings(max_examples=300, deadline=None)
@given(TEXT, st.data())
def test_any_byte_split_of_utf8_text_joins_back_whole_and_each_piece_reads_as_bytes(text, data):
    raw = text.encode("utf-8")
    cuts = sorted(data.draw(st.sets(st.integers(0, len(raw)), max_size=8)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    assert readable(b"".join(pieces)) == text
    for piece in pieces:
        shown = readable(piece)
        assert "\ufffd" not in shown and not PY_ESCAPE.search(shown)
        # Only the bytes outside a whole character are in the notation, and they are the piece's bytes.
        rest = NOTATION.sub("", shown).encode("utf-8")
        assert len(rest) + 6 * len(NOTATION.findall(shown)) == len(shown.encode("utf-8"))
        assert len(rest) + len(NOTATION.findall(shown)) == len(piece)


@settings(max_examples=200, deadline=None)
@given(TEXT, st.data())
def test_a_real_byte_level_vocabulary_joins_any_window_of_tokens(text, data):
    """The bundled tokenizer (1,024 entries) splits most non-ASCII characters over byte tokens."""
    ids = TINY._tok.encode(text, add_special_tokens=False).ids
    assert TINY.text(ids) == text
    a = data.draw(st.integers(0, len(ids)))
    b = data.draw(st.integers(a, len(ids)))
    for shown in (TINY.text(ids[a:b]), *(TINY.token(t) for t in ids[a:b])):
        assert "\ufffd" not in shown and not PY_ESCAPE.search(shown)
    for i, t in enumerate(ids):  # a piece of a character names it, completed by its neighbours; a whole one names none
        part = TINY.within(ids, i)
        assert bool(part) == ("<0x" in TINY.token(t)) and all(c in text for c in part)
    tail = TINY.tail(ids[:b], 3)
    # The cut moves back to a character's first byte: the context never opens on a continuation byte.
    assert not re.match(r"…?<0x[89AB][0-9A-F]>", tail)


def test_a_byte_fallback_vocabulary_prints_its_byte_tokens_in_the_same_notation(tmp_path):
    """A sentencepiece-style vocabulary (<0xE6> pieces, Llama 2 and Mistral): the same notation,
    its byte tokens joined where they make a character."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<unk>": 0, "▁a": 1, **{f"<0x{b:02X}>": 2 + b for b in range(256)}}
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.save(str(tmp_path / "tokenizer.json"))
    dec = Decoder(str(tmp_path / "tokenizer.json"))
    e6, x80, x8e = 2 + 0xE6, 2 + 0x80, 2 + 0x8E
    assert dec.token(e6) == "<0xE6>" and dec.token(1) == " a"
    assert dec.text([1, e6, x80, x8e, 1]) == " a怎 a"
    assert dec.text([1, e6, x80]) == " a<0xE6><0x80>"
    assert dec.text([1, 9999]) == " a<9999>"  # an id the vocabulary lacks is shown, never dropped


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.text: list[str] = []
        self.titles: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.titles += [v for k, v in attrs if k == "title" and v]

    def handle_data(self, data):
        self.text.append(data)


def _md_tables(md_text: str) -> list[list[list[str]]]:
    """report.md's tables as a markdown renderer reads them: rows of cell texts, header first."""
    tables: list[list[list[str]]] = []
    row: list[str] = []
    inside = False
    for t in MarkdownIt("commonmark").enable("table").parse(md_text):
        if t.type in ("table_open", "table_close"):
            inside = t.type == "table_open"
            tables += [[]] if inside else []
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and inside:
            row.append("".join(c.content if c.type in ("text", "html_inline") else "|" for c in t.children or []
                               if c.type in ("text", "html_inline", "hardbreak", "softbreak")))
        elif t.type == "tr_close":
            tables[-1].append(row)
    return tables


def test_a_real_model_report_prints_byte_pieces_in_the_notation(tmp_path, monkeypatch):
    """The committed SmolLM2-135M runs (vLLM bf16 baseline, transformers bf16 on an H200) compared
    as a user types it, from the repository root with relative paths: multi-010's candidate token
    37911 is E6 80 (the first two bytes of a CJK character), multi-018's tokens are lone
    continuation bytes (B6, B3) after a context that ends on D0, multi-011's context window opens
    inside a character. Before: “\\xe6\\x80” (37911) and a context of “…��到，我们”."""
    smollm2_converted("tokenizer.json")
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["compare", "baselines/smollm2-135m-vllm-bf16",
                                 "benchmarks/results/smollm2-gpu/runs/hf-cuda-bfloat16", "--out", str(out)],
                           env={"COLUMNS": "160"})
    assert r.exit_code == 1, r.output  # near-ties fail under auto's strict default for an unprofiled bf16 pair
    texts = {f: (out / f).read_text(encoding="utf-8") for f in ("report.md", "report.html", "junit.xml")}
    texts["console"] = r.output
    for name, text in texts.items():
        assert not PY_ESCAPE.search(text), name
        assert "\ufffd" not in text, name

    tables = _md_tables(texts["report.md"])
    assert all(len(row) == len(t[0]) for t in tables for row in t)  # no piece broke a table
    rows = {row[0]: row for t in tables if "context before" in t[0] for row in t}
    # The piece, then the character the tokens around it make of it (the candidate's next is A7: 性).
    assert rows["multi-010"][5] == "“<0xE6><0x80>” (37911) in “性”"
    assert rows["multi-018"][3].endswith("<0xD0>") and rows["multi-018"][4] == "“<0xB6>” (131) in “ж”"
    assert "“<0xB3>” (128) in “г” -1.468" in rows["multi-018"][8]  # a top-k piece after the same D0
    assert rows["multi-011"][3] == "…看到，我们"

    page = _Text()
    page.feed(texts["report.html"])
    shown = "".join(page.text) + "\n".join(page.titles)
    assert "<0x" not in texts["report.html"]  # escaped: never read as a tag
    assert "candidate “<0xE6><0x80>” (37911) in “性”" in shown and "“<0xB6>” (131)" in shown
    assert any(t.startswith("14: id 37911, logprob ") and t.endswith(", in “性”") for t in page.titles)  # its chip
    assert "как он живот" in "".join(page.text)  # the continuation joined: Ж's two bytes print whole
    assert html.unescape("&lt;0xD0&gt;") in shown

    assert "“<0xE6>" in texts["console"] and "“<0xB6>”" in texts["console"]
    s = CliRunner().invoke(app, ["show", str(out), "--prompt", "multi-018"], env={"COLUMNS": "120"})
    assert s.exit_code == 0 and "“<0xB6>” (131) in “ж”" in s.output and "как он живот" in s.output, s.output
    assert not PY_ESCAPE.search(s.output) and "\ufffd" not in s.output


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["|", "<b>", "`", "*", "\\", "\n", "\u202e", "\u2028", "\u0085", "\xa0", "性", "ж",
                                 "👩", "&amp;", "<0xE6>", "#", "[x](y)"]) | TEXT, max_size=12))
def test_no_piece_breaks_a_markdown_row_or_the_html(parts):
    """Hostile model text (table pipes, tags, code spans, bidi overrides, line separators, C1
    controls, a literal <0xE6>) split by a real byte-level vocabulary: each token's cell, with the
    character its neighbours make of it, keeps a markdown row whole and the html free of tags; a
    bidi override or a line separator shows as its escape (\u202e), never reorders the page."""
    from strict_gate.report.html_prompt import escape
    from strict_gate.report.text import md, show_token

    ids = TINY._tok.encode("".join(parts), add_special_tokens=False).ids
    cells = [show_token(TINY, t, ids[:i], ids[i + 1:]) for i, t in enumerate(ids)] + [TINY.tail(ids, 4)]
    row = "| " + " | ".join(md(c) for c in cells) + " |"
    table = _md_tables("| " + " | ".join("h" for _ in cells) + " |\n|" + "---|" * len(cells) + "\n" + row + "\n")
    assert len(table) == 1 and len(table[0]) == 2 and len(table[0][1]) == len(cells), row
    for c in cells:  # the context (last) is raw text: md() and escape() make it safe
        assert "\ufffd" not in c and not PY_ESCAPE.search(c)
        assert "<" not in escape(c) and "\u2028" not in escape(c) and "\u202e" not in escape(c)
    assert all("\n" not in c and "\u202e" not in c for c in cells[:-1])  # one token, one visible cell
