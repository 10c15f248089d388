#!/usr/bin/env python
"""A command engine for the invariance tests: batch-invariant, or batch-dependent on purpose.

    python variant_engine.py [--mode MODE] [--max-in-flight N] [--gap G] [--shift S] [--no-chunk] [--no-cache]
                             [--score] [--garbage] [--stop J] [--delay S] [--tag NAME] [--speculative] [--at N]
                             [--score-breaks-after N] [--score-break error|garbage]
                             [--move-at I] [--every N]

It reads every request already waiting on stdin before it answers (so requests the gate keeps
in flight really are served together), and answers a group in reverse order (so the gate must
match replies by id). Token i of a prompt is a function of the prompt alone:
(sum(ids) * 31 + 7 * i) % 1000 + 1 + S, its logprob -0.1, the runner-up (token + 1) G nats below
(S: --shift, 0 by default; another S is another engine at batch 1 already). --delay S: each group
is answered S seconds after it is read (a test signals the gate meanwhile).

A test counts and stops it through its environment (the gate's, which its engines inherit):
$VARIANT_ENGINE_REQUESTS names a file where each process appends "TAG start" when it starts and
"TAG generate ID" per generate request as it reads it (TAG: --tag, "engine" by default), and
$VARIANT_ENGINE_HOLD = "TAG:WHAT:N" (WHAT: start or generate) holds the process that appends
the Nth such line of its tag (before its hello, or before answering) until its stdin has more to
read or closes: the gate is then waiting on it at a known point, for the test to signal.

--score declares the score op: teacher-forced, position i's top-2 are the batch-1 token and its
runner-up G nats below, whatever the prefix (the model above). --garbage: where token 2 moved,
every later token is one that model ranks nowhere (token + 500), claimed as the engine's own top-1.
--stop J: where token 2 moved, the reply stops after position J (finish "stop", J + 1 tokens, the
last an ordinary token, no end-of-sequence id) where the batch-1 run went on to max_tokens.
--score-breaks-after N: from its (N+1)th score request on, the score op breaks (--score-break:
`error` answers an error, `garbage` answers steps with no top-k), as a golden failing mid-way.
--move-at I: the token that moves is token I (2 by default). --every N: only a prompt whose ids sum
to a multiple of N moves (1 by default: every prompt), so two engines can move on different prompts.
--speculative declares "speculative": a request carrying it gets the same tokens and honest
acceptance counts, a function of the prompt (K drafted per verification, one verification every
other token, sum(ids) % (min(drafted, emitted - 1) + 1) accepted), and its line in
$VARIANT_ENGINE_REQUESTS reads "TAG generate ID specK"; a request carrying "prefill_chunk": C adds
" chunkC" to its line.

Modes (what makes the tokens move, or the protocol break):
  invariant   nothing: the tokens never depend on how the prompt was served
  in_flight   token 2 is the runner-up when more than one request is served together
  chunk       token 2 is the runner-up when a "prefill_chunk" shorter than the prompt is asked for
  cache       token 2 is the runner-up when the prompt's prefix was served before (a cache hit)
  boundary    token 2 is the runner-up only at exactly N tokens (--at N, 64 by default): a prefill
              chunk of N cutting a longer prompt, or a cached prefix of exactly N tokens (a state-carry
              bug at a linear-attention kernel's chunk boundary); one token either side is exact
  stray_id    answers the second request of a group with an id that was never sent
  extra       answers the first request of a group twice (more replies than requests)
  refuse      declares max_in_flight but, given more than one request at once, never answers
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time

VOCAB = 1000


def send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _best(ids, i: int, shift: int) -> int:
    return (sum(ids) * 31 + 7 * i) % VOCAB + 1 + shift


def score(req: dict, gap: float, shift: int) -> dict:
    """Teacher forcing: each continuation token's logprob and the top-k of the batch-1 model."""
    ids, k = req["prompt_token_ids"], max(2, req.get("top_logprobs", 2))
    steps = []
    for i, t in enumerate(req["continuation_ids"]):
        best = _best(ids, i, shift)
        top = [[best, -0.1], [best + 1, -0.1 - gap]] + [[VOCAB + 10 + j, -9.0 - j] for j in range(k - 2)]
        steps.append({"token_id": t, "logprob": next((v for x, v in top if x == t), -20.0), "top": top})
    return {"id": req["id"], "steps": steps}


def speculated(req: dict, emitted: int) -> dict:
    """Acceptance counts that obey docs/engine-protocol.md's rules, distinct per prompt."""
    k, steps = req["speculative"]["num_speculative_tokens"], max(emitted - 1, 0) // 2
    drafted = k * steps
    return {"drafted": drafted, "accepted": sum(req["prompt_token_ids"]) % (min(drafted, emitted - 1) + 1),
            "drafts": steps}


def tokens(req: dict, moved: bool, gap: float, shift: int = 0, garbage: bool = False, stop: int | None = None,
           at: int = 2) -> dict:
    ids = req["prompt_token_ids"]
    k = max(1, req.get("top_logprobs", 1))
    toks, tops = [], []
    for i in range(req["max_tokens"]):
        best = _best(ids, i, shift) + (500 if garbage and moved and i > at else 0)
        runner = best + 1
        chosen = runner if moved and i == at else best
        other = best if chosen == runner else runner
        top = [[chosen, -0.1], [other, -0.1 - gap]] + [[VOCAB + 10 + j, -9.0 - j] for j in range(max(0, k - 2))]
        toks.append(chosen)
        tops.append(top[:k] if k >= 2 else top[:1])
        if moved and i == stop:
            break
    finish = "stop" if len(toks) < req["max_tokens"] else "length"
    return {"id": req["id"], "token_ids": toks, "finish_reason": finish, "top_logprobs": tops}


class Lines:
    """stdin's lines read from the descriptor itself: a buffered reader would hold lines that
    select() no longer sees, and the group in flight would look like one request."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.eof = fd, b"", False

    def _fill(self, timeout: float | None) -> None:
        if select.select([self.fd], [], [], timeout)[0]:
            data = os.read(self.fd, 65536)
            self.buf += data
            self.eof = not data

    def group(self) -> list[dict] | None:
        """Block for one request, then take every request already waiting (what is in flight)."""
        while b"\n" not in self.buf and not self.eof:
            self._fill(None)
        while not self.eof:
            before = len(self.buf)
            self._fill(0.05)
            if len(self.buf) == before:
                break
        if b"\n" not in self.buf:
            return None
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def drain(self) -> None:
        while not self.eof:
            self._fill(None)


def note(tag: str, what: str, stdin_fd: int, detail: str = "") -> None:
    """One line in $VARIANT_ENGINE_REQUESTS; at the line $VARIANT_ENGINE_HOLD names, wait for stdin."""
    path = os.environ.get("VARIANT_ENGINE_REQUESTS")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{tag} {what} {detail}".rstrip() + "\n")
    with open(path, encoding="utf-8") as f:
        n = sum(1 for line in f if line.split()[:2] == [tag, what])
    if os.environ.get("VARIANT_ENGINE_HOLD") == f"{tag}:{what}:{n}":
        select.select([stdin_fd], [], [], 60)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="invariant")
    ap.add_argument("--max-in-flight", type=int, default=8)
    ap.add_argument("--gap", type=float, default=3.0)
    ap.add_argument("--shift", type=int, default=0)
    ap.add_argument("--no-chunk", action="store_true")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--score", action="store_true")
    ap.add_argument("--garbage", action="store_true")
    ap.add_argument("--stop", type=int, default=None)
    ap.add_argument("--tag", default="engine")
    ap.add_argument("--speculative", action="store_true")
    ap.add_argument("--at", type=int, default=64)
    ap.add_argument("--move-at", type=int, default=2)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--score-breaks-after", type=int, default=None)
    ap.add_argument("--score-break", choices=["error", "garbage"], default="error")
    args = ap.parse_args()
    scored = 0
    note(args.tag, "start", sys.stdin.fileno())
    caps = ["generate"] + ([] if args.no_chunk else ["prefill_chunk"]) + (["score"] if args.score else [])
    caps += ["speculative"] if args.speculative else []
    send({"hello": "strict-gate/engine@1", "name": "variant-engine", "version": "1", "capabilities": caps,
          "max_in_flight": args.max_in_flight, "prefix_cache": not args.no_cache, "pid": os.getpid()})
    seen: set[tuple[int, ...]] = set()
    stdin = Lines(sys.stdin.fileno())
    while True:
        group = stdin.group()
        if group is None:
            return 0
        if any(r.get("op") == "shutdown" for r in group):
            return 0
        if group[0].get("op") != "score":
            for req in group:
                spec = f" spec{req['speculative']['num_speculative_tokens']}" if "speculative" in req else ""
                spec += f" chunk{req['prefill_chunk']}" if "prefill_chunk" in req else ""
                note(args.tag, "generate", stdin.fd, req["id"] + spec)
        time.sleep(args.delay)
        if group[0].get("op") == "score":
            for req in group:
                scored += 1
                if args.score_breaks_after is None or scored <= args.score_breaks_after:
                    send(score(req, args.gap, args.shift))
                elif args.score_break == "error":
                    send({"id": req["id"], "error": "the golden broke mid-way"})
                else:
                    send({"id": req["id"], "steps": [{"token_id": t, "logprob": None, "top": []}
                                                     for t in req["continuation_ids"]]})
            continue
        if args.mode == "refuse" and len(group) > 1:
            stdin.drain()
            return 0
        replies = []
        for n, req in enumerate(group):
            ids = tuple(req["prompt_token_ids"])
            chunk = req.get("prefill_chunk")
            moved = {"in_flight": len(group) > 1,
                     "chunk": bool(chunk) and chunk < len(ids),
                     "cache": any(len(s) >= 2 and ids[: len(s)] == s for s in seen),
                     "boundary": (chunk == args.at and len(ids) > args.at)
                     or any(len(s) == args.at and s != ids and ids[: args.at] == s for s in seen)}.get(args.mode, False)
            moved = moved and sum(ids) % args.every == 0
            seen.add(ids)
            reply = tokens(req, moved, args.gap, args.shift, args.garbage, args.stop, args.move_at)
            if "speculative" in req:
                reply["speculative"] = speculated(req, len(reply["token_ids"]))
            if args.mode == "stray_id" and n == 1:
                reply["id"] = "never-sent"
            replies.append(reply)
            if args.mode == "extra" and n == 0 and len(group) > 1:
                replies.append(dict(reply))
        for reply in reversed(replies):
            send(reply)


if __name__ == "__main__":
    sys.exit(main())
