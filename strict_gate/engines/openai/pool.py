"""Several servers for one arm: a work queue, one worker thread per server, batch 1 each.

Every prompt goes to exactly one server, one request at a time per server, so the records
are those a single server gives (greedy, batch 1) whichever server answered. They are
yielded in prompt-set order. A server that fails (it exits, stops answering, answers 5xx
past its retries) is retired: the prompt it failed on gets an error record naming it, and
the other servers take the remaining prompts. Once every prompt has been tried, a failed
server still fails the arm (EngineError), so that the run is closed as failed, not complete:
`strict-gate gate --resume` re-runs exactly its error records and missing prompts. When no
server is left, the records done are yielded and the arm fails at once; the prompts never
run stay missing.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from strict_gate.engines.base import PromptInput
from strict_gate.errors import EngineError
from strict_gate.runs.records import Record

S = TypeVar("S")  # a server handle
WAIT_S = 0.2  # how often the consumer wakes (Ctrl-C is seen at once anyway)


class ServerFailed(EngineError):
    """The server itself failed on a prompt (not the prompt's own fault)."""


def dispatch(servers: Sequence[S], prompts: Sequence[PromptInput],
             run_one: Callable[[S, PromptInput], Record], name: Callable[[S], str]) -> Iterator[Record]:
    """Run every prompt on one of `servers` through run_one; records in prompt order.

    run_one raises ServerFailed when the server failed (the server is retired), any other
    exception when the arm as a whole cannot go on (it is re-raised here).
    """
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for item in enumerate(prompts):
        todo.put(item)
    done: queue.SimpleQueue = queue.SimpleQueue()  # (index, Record | BaseException), or (None, None): a worker ended
    stop = threading.Event()
    failed: list[S] = []  # filled by the workers before they hand over the error record
    errored: list[str] = []

    def work(server: S) -> None:
        while not stop.is_set():
            try:
                i, p = todo.get_nowait()
            except queue.Empty:
                break
            try:
                done.put((i, run_one(server, p)))
            except ServerFailed as e:
                failed.append(server)
                errored.append(p.id)
                done.put((i, Record(id=p.id, prompt_token_ids=p.token_ids, error=str(e))))
                break
            except BaseException as e:
                done.put((i, e))
                break
        done.put((None, None))

    for s in servers:
        threading.Thread(target=work, args=(s,), daemon=True, name=f"strict-gate-{name(s)}").start()
    ready: dict[int, Record] = {}
    running = len(servers)
    nxt = 0
    try:
        while nxt < len(prompts):
            if nxt in ready:
                yield ready.pop(nxt)
                nxt += 1
                continue
            if not running:
                break
            try:
                i, item = done.get(timeout=WAIT_S)
            except queue.Empty:
                continue
            if i is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                ready[i] = item
        if nxt < len(prompts):  # every server failed before the queue was empty
            not_run = len(prompts) - nxt - len(ready)
            for i in sorted(ready):
                yield ready[i]
            raise EngineError(
                f"openai: every server failed ({'; '.join(name(s) for s in failed)}); "
                f"{not_run} prompts were not run (the error records name each failure)"
            )
        if failed:
            raise EngineError(
                f"openai: {'; '.join(name(s) for s in failed)} failed; the other servers answered every other "
                f"prompt; error records for {', '.join(map(repr, errored))} (`strict-gate gate --resume` re-runs them)"
            )
    finally:
        stop.set()
