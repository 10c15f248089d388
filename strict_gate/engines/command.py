"""Any engine binary, driven over stdin/stdout JSON lines (protocol strict-gate/engine@1).

The gate starts the command in its own process group, reads a hello line, then sends one
request at a time (batch 1) and reads one response line per request. stdout carries only
protocol lines; the engine's stderr is appended to a log file whose tail is quoted when the
engine dies. Every failure (bad JSON, wrong id, early exit, hang, invalid response) is an
EngineError naming the prompt, and kills the whole process group: no engine process
outlives close() or an error. The protocol is specified in docs/engine-protocol.md.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from strict_gate.engines.base import Engine, PromptInput, ScoredStep, find_tokenizer_json
from strict_gate.engines.eos import eos_token_ids
from strict_gate.engines.process import close_log, open_log, signals_deferred, spawn, stop_group, wait_exit
from strict_gate.errors import ConfigError, EngineError, MissingExtraError
from strict_gate.options import Seconds
from strict_gate.engines.command_replies import ReplyError, generate_record, scored_steps
from strict_gate.records import EngineInfo, Record, Sampling, Timing
from strict_gate.redact import scrub

PROTOCOL = "strict-gate/engine@1"
QUOTE_CHARS = 200  # how much of a bad line an error quotes
STDERR_TAIL_LINES = 20
MAX_BANNER_LINES = 1000  # non-JSON stdout lines tolerated before the hello (library banners)
SHUTDOWN_GRACE_S = 5.0  # after {"op": "shutdown"}: time to exit on its own
TERM_GRACE_S = 2.0  # after SIGTERM: time before SIGKILL
KILL_WAIT_S = 5.0  # after SIGKILL: time for the group to be gone (a member in uninterruptible sleep)

_EOF = object()


@dataclass(frozen=True)
class CommandOptions:
    command: list[str]
    tokenizer: str | None = None  # tokenizer.json or a model dir holding one (for text prompts)
    model: str | None = None  # informational: what the binary serves (the hello may say it too)
    timeout_s: Seconds = 120.0  # per request
    startup_timeout_s: Seconds = 300.0  # until the hello line
    cwd: str | None = None  # default: the config's directory
    log: str | None = None  # stderr log; default: the run directory's engine.log, else a temp file
    eos_token_ids: list[int] | None = None  # default: from generation_config.json / config.json by the tokenizer


def _quote(line: str | bytes, n: int = QUOTE_CHARS) -> str:
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.rstrip("\r\n")
    return repr(line if len(line) <= n else line[:n] + f"... ({len(line)} chars)")


class CommandEngine(Engine):
    kind = "command"
    Options = CommandOptions
    can_score = True  # narrowed per instance to what the hello declares
    in_process = False
    writes_log = True

    def __init__(self, options: CommandOptions, env=None, base_dir="."):
        super().__init__(options, env, base_dir)
        if not options.command or not all(isinstance(a, str) and a for a in options.command):
            raise ConfigError("command: `command` must be a non-empty list of strings (no shell)")
        if options.timeout_s <= 0 or options.startup_timeout_s <= 0:
            raise ConfigError("command: timeout_s and startup_timeout_s must be > 0")
        self.argv = [self._resolve_arg(a) for a in options.command]
        if self.argv[0] in ("python", "python3"):  # the gate's own interpreter (its venv), not PATH's
            self.argv[0] = sys.executable
        self.cwd = str((self.base_dir / options.cwd).resolve()) if options.cwd else str(self.base_dir.resolve())
        self.tokenizer_path = self._tokenizer_file() if options.tokenizer else None
        self.eos_token_ids = self._eos_ids()
        self.hello: dict | None = None
        self._proc: subprocess.Popen | None = None
        self._pgid: int | None = None
        self._lines: queue.Queue | None = None
        self._reader: threading.Thread | None = None
        self._log_file = None
        self._log_used: str | None = None
        self._tok = None
        self._seq = 0

    # -- configuration
    def _resolve_arg(self, arg: str) -> str:
        """A relative path that exists next to the config is made absolute; anything else passes."""
        if arg.startswith("-") or os.path.isabs(arg):
            return arg
        p = self.base_dir / arg
        # abspath, not resolve(): a venv's bin/python is a symlink, and resolving it would run
        # the base interpreter outside the venv
        return os.path.abspath(p) if p.exists() else arg

    def _tokenizer_file(self) -> str:
        path = find_tokenizer_json(self.options.tokenizer, self.base_dir)
        if path is None:
            raise ConfigError(
                f"command: tokenizer {self.options.tokenizer!r} not found "
                "(give a tokenizer.json file or a model directory holding one)"
            )
        return str(path)

    def _eos_ids(self) -> tuple[int, ...] | None:
        """The ids the engine is told to stop on: the option, else what vLLM stops on for the
        model directory holding the tokenizer (strict_gate.engines.eos)."""
        if self.options.eos_token_ids is not None:
            return tuple(self.options.eos_token_ids)
        if self.tokenizer_path is None:
            return None
        return eos_token_ids(Path(self.tokenizer_path))

    # -- lifecycle
    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        self._cleanup()  # a previous process that died: reap it and its group first
        log = self.options.log
        if log is not None:
            log_path = Path(log) if os.path.isabs(log) else self.base_dir / log
        else:
            log_path = self.log_path
        self._log_file, self._log_used, temp_log = open_log(
            log_path, "strict-gate-command-", scrub(f"--- strict-gate: starting {self.argv!r} in {self.cwd}")
        )
        try:
            # its own group: close() kills the binary and all it started
            self._proc = spawn(
                self.argv, self.env, self.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log_file
            )
        except OSError as e:
            close_log(self._log_file)
            self._log_file = None
            if temp_log:
                os.unlink(self._log_used)
            if isinstance(e, FileNotFoundError):
                why = f"{self.argv[0]!r}: not found (cwd {self.cwd})"
            elif isinstance(e, PermissionError):
                why = f"{self.argv[0]!r}: permission denied"
            else:
                why = f"{self.argv!r}: {e}"
            raise ConfigError(f"command: cannot run {why}") from None
        self._pgid = self._proc.pid
        self._lines = queue.Queue()
        self._reader = threading.Thread(
            target=self._read_stdout, args=(self._proc.stdout, self._lines), daemon=True, name="strict-gate-command"
        )
        self._reader.start()
        try:
            self._read_hello()
        except BaseException:
            self._kill()
            raise

    @staticmethod
    def _read_stdout(stream, lines: queue.Queue) -> None:
        try:
            for raw in iter(stream.readline, b""):
                lines.put(raw)
        except (OSError, ValueError):
            pass
        finally:
            lines.put(_EOF)

    def _read_hello(self) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        for _ in range(MAX_BANNER_LINES + 1):
            raw = self._next_line(deadline, what="its hello line", timeout_name="startup_timeout_s",
                                  timeout=self.options.startup_timeout_s)
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                # Libraries print banners on stdout at load; keep them in the log, wait for the hello.
                self._log_note(f"stdout before hello: {raw.decode('utf-8', 'replace').rstrip()}")
                continue
            if not isinstance(obj, dict) or "hello" not in obj:
                raise self._fail(f"its first JSON line must be the hello, got {_quote(raw)}")
            break
        else:
            raise self._fail(f"no hello line within its first {MAX_BANNER_LINES} stdout lines")
        if obj["hello"] != PROTOCOL:
            raise self._fail(f'its hello speaks {obj["hello"]!r}; this gate speaks {PROTOCOL!r}')
        caps = obj.get("capabilities", ["generate"])
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            raise self._fail(f'hello "capabilities" must be a list of strings, got {caps!r}')
        if "generate" not in caps:
            raise self._fail(f'hello "capabilities" {caps!r} lacks "generate"')
        for key in ("name", "version", "model"):
            if key in obj and obj[key] is not None and not isinstance(obj[key], str):
                raise self._fail(f'hello "{key}" must be a string, got {obj[key]!r}')
        if "versions" in obj and not isinstance(obj["versions"], dict):
            raise self._fail(f'hello "versions" must be an object, got {obj["versions"]!r}')
        self.hello = obj
        self.can_score = "score" in caps  # instance attribute shadows the class default

    def close(self) -> None:
        """Ask for a shutdown, give it a few seconds, then SIGTERM and SIGKILL the group.

        A signal arriving meanwhile cuts the waits short and is re-delivered afterwards: the
        group is gone whatever happens."""
        if self._proc is None:
            return
        with signals_deferred():
            if self._proc.poll() is None:
                try:
                    self._write({"op": "shutdown"}, time.monotonic() + 1.0)
                except (TimeoutError, OSError):
                    pass
                try:
                    self._proc.stdin.close()
                except OSError:
                    pass
                wait_exit(self._proc, SHUTDOWN_GRACE_S)
            self._kill()

    def _kill(self) -> None:
        """Terminate the whole process group (SIGTERM, then SIGKILL) and release pipes and log."""
        proc, pgid = self._proc, self._pgid
        if proc is None:
            return
        stop_group(proc, pgid, TERM_GRACE_S, KILL_WAIT_S)
        # The group is gone, so stdout is at EOF and the reader ends. Close stdout only after
        # it has: closing a buffered stream under a blocked reader could wait on its lock.
        reader_done = True
        if self._reader is not None:
            self._reader.join(timeout=2)
            reader_done = not self._reader.is_alive()
        for stream in (proc.stdin, proc.stdout if reader_done else None):
            try:
                if stream is not None:
                    stream.close()
            except (OSError, ValueError):
                pass
        self._proc = None
        self._pgid = None
        self._reader = None
        self._lines = None
        close_log(self._log_file)
        self._log_file = None

    def _cleanup(self) -> None:
        if self._proc is not None:
            self._kill()

    def _log_note(self, text: str) -> None:
        if self._log_file is not None:
            try:
                self._log_file.write(f"--- strict-gate: {text}\n".encode("utf-8", "replace"))
                self._log_file.flush()
            except (OSError, ValueError):
                pass

    # -- line I/O
    def _write(self, obj: dict, deadline: float) -> None:
        """Write one request line; a child that stops reading stdin cannot block us past deadline."""
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        fd = self._proc.stdin.fileno()
        os.set_blocking(fd, False)
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            _, writable, _ = select.select([], [fd], [], remaining)
            if not writable:
                continue
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                continue
            view = view[n:]

    def _next_line(self, deadline: float, *, what: str, timeout_name: str, timeout: float) -> bytes:
        """The next non-blank stdout line, or an EngineError for a hang or an exit."""
        while True:
            try:
                item = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise self._fail(
                    f"no answer within {timeout_name} = {timeout:g} s while waiting for {what} (engine hung?)", tail=5
                ) from None
            if item is _EOF:
                raise self._exited(f"while we waited for {what}")
            if item.strip():
                return item

    # -- failure reporting
    def _stderr_tail(self, n: int = STDERR_TAIL_LINES) -> str:
        if self._log_file is not None:
            try:
                self._log_file.flush()
            except (OSError, ValueError):
                pass
        if not self._log_used:
            return ""
        try:
            with open(self._log_used, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 64 * 1024))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        lines = [ln for ln in text.splitlines() if not ln.startswith("--- strict-gate: ")]
        return "\n".join(lines[-n:])

    def _describe_exit(self) -> str:
        proc = self._proc
        try:
            code = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "closed its stdout but is still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by {name}"
        return f"exited with code {code}"

    def _exited(self, when: str) -> EngineError:
        how = self._describe_exit()
        tail = self._stderr_tail()
        msg = f"command engine {self._name()} {how} {when}"
        if tail:
            msg += f"; last lines of its stderr ({self._log_used}):\n" + tail
        else:
            msg += f"; its stderr log ({self._log_used}) is empty"
        self._kill()
        return EngineError(msg)

    def _fail(self, msg: str, *, tail: int = 0) -> EngineError:
        """An EngineError for a protocol violation or hang; the process group is killed first."""
        log = self._log_used
        text = self._stderr_tail(tail) if tail else ""
        self._kill()
        msg = f"command engine {self._name()}: {msg} (stderr log: {log})"
        if text:
            msg += "; last lines of its stderr:\n" + text
        return EngineError(msg)

    def _name(self) -> str:
        if self.hello and self.hello.get("name"):
            return repr(self.hello["name"])
        return repr(os.path.basename(self.argv[0]))

    # -- one request, one response
    def _request(self, req: dict, label: str) -> dict:
        """Send req, read its response object; any failure kills the engine and raises."""
        if not self.running:
            if self._proc is not None:
                raise self._exited(f"before {label} was sent")
            raise EngineError(f"command engine is not started ({label})")
        deadline = time.monotonic() + self.options.timeout_s
        try:
            try:
                self._write(req, deadline)
            except TimeoutError:
                raise self._fail(f"{label}: it did not read its stdin within timeout_s = {self.options.timeout_s:g} s")
            except (BrokenPipeError, ConnectionResetError):
                raise self._exited(f"before {label} was sent (stdin closed)") from None
            raw = self._next_line(deadline, what=f"the response to {label}", timeout_name="timeout_s",
                                  timeout=self.options.timeout_s)
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                why = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
                raise self._fail(f"{label}: malformed JSON line ({why}): {_quote(raw)}") from None
            if not isinstance(obj, dict):
                raise self._fail(f"{label}: the response must be a JSON object, got {_quote(raw)}")
            if obj.get("id") != req["id"]:
                raise self._fail(
                    f"{label}: response carries id {obj.get('id')!r}, expected {req['id']!r} "
                    "(one request at a time, answered in order)"
                )
            return obj
        except EngineError:
            raise
        except BaseException:  # Ctrl-C or an internal error mid-request: the stream is out of step
            self._kill()
            raise

    def _invalid(self, label: str, why: str, obj: dict) -> EngineError:
        return self._fail(f"{label}: invalid response: {why}; response: {_quote(json.dumps(obj))}")

    # -- the protocol
    def info(self) -> EngineInfo:
        versions: dict = {"protocol": PROTOCOL}
        model = self.options.model
        if self.hello is not None:
            versions.update({str(k): str(v) for k, v in (self.hello.get("versions") or {}).items()})
            name = self.hello.get("name") or os.path.basename(self.argv[0])
            versions[name] = self.hello.get("version") or "?"
            model = model or self.hello.get("model")
        options = asdict(self.options) | {"resolved_command": self.argv, "resolved_cwd": self.cwd}
        if self._log_used:
            options["log_used"] = self._log_used
        if self.hello is not None:
            options["hello"] = self.hello
        return EngineInfo(
            kind=self.kind,
            model=model,
            options=options,
            env=self.env,
            versions=versions,
            tokenizer=self.tokenizer_path,
        )

    def tokenize(self, text: str) -> list[int]:
        if self.tokenizer_path is None:
            raise ConfigError(
                "command: cannot tokenize text prompts without `tokenizer` (a tokenizer.json or a model "
                "directory); set it, or give the prompts as token_ids"
            )
        if self._tok is None:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise MissingExtraError("tokenizers", "hf") from None
            try:
                self._tok = Tokenizer.from_file(self.tokenizer_path)
            except Exception as e:
                raise ConfigError(f"command: cannot load tokenizer {self.tokenizer_path}: {e}") from None
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        self.start()
        for p in prompts:
            yield self._generate_one(p, sampling)

    def _generate_one(self, p: PromptInput, sampling: Sampling) -> Record:
        label = f"prompt {p.id!r}"
        req = {
            "op": "generate",
            "id": p.id,
            "prompt_token_ids": list(p.token_ids),
            "max_tokens": sampling.max_tokens,
            "top_logprobs": sampling.top_logprobs,
        }
        if self.eos_token_ids:
            req["eos_token_ids"] = list(self.eos_token_ids)
        t0 = time.perf_counter()
        obj = self._request(req, label)
        wall = time.perf_counter() - t0
        if "error" in obj:
            if not isinstance(obj["error"], str) or not obj["error"]:
                raise self._invalid(label, '"error" must be a non-empty string', obj)
            return Record(id=p.id, prompt_token_ids=p.token_ids, error=obj["error"])
        try:
            rec = generate_record(obj, p.token_ids, sampling, label, self.eos_token_ids)
        except ReplyError as e:
            raise self._invalid(label, str(e), obj) from None
        if rec.timing is None or rec.timing.total_s is None:
            rec = replace(rec, timing=Timing(ttft_s=rec.timing.ttft_s if rec.timing else None, total_s=wall))
        return rec

    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
        self.start()
        if not self.can_score:
            raise EngineError(
                f"command engine {self._name()} cannot score: its hello capabilities are "
                f"{(self.hello or {}).get('capabilities')!r} (no \"score\")"
            )
        if not continuation_ids:
            return []
        self._seq += 1
        rid = f"score-{self._seq}"
        label = f"score request {rid!r} ({len(prompt_ids)} prompt + {len(continuation_ids)} continuation ids)"
        req = {
            "op": "score",
            "id": rid,
            "prompt_token_ids": list(prompt_ids),
            "continuation_ids": list(continuation_ids),
            "top_logprobs": max(k, 1),  # a step's top always holds its argmax
        }
        obj = self._request(req, label)
        if "error" in obj:
            # the engine is still in step and alive: the error is this request's, not the engine's
            raise EngineError(f"command engine {self._name()}: {label}: the engine answered {obj['error']!r}")
        try:
            return scored_steps(obj, continuation_ids, req["top_logprobs"])
        except ReplyError as e:
            raise self._invalid(label, str(e), obj) from None
