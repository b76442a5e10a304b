"""Running the blocks of README.md and docs/*.md in a scratch directory (used by test_docs_examples.py).

Shell lines run through the real command line in-process (typer's CliRunner, in the workspace as
current directory); ``curl`` lines are sent with httpx exactly as curl would send them (``-d``
without a content-type header is ``application/x-www-form-urlencoded``, as curl sends it); Python
blocks are executed. ``neobert-embed serve`` starts a real uvicorn server on a free loopback port,
and the lines and blocks after it talk to that server (``localhost:8080`` rewritten to its port).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from docs_blocks import Block, cli_args, command_lines, concrete, is_synopsis

DOCUMENTED_PORT = "8080"


@dataclass
class Run:
    """A block run for real in the workspace of ``group`` (blocks of one group run in document order).

    ``subs``: a documented word → what replaces it (a shell word, or a quoted Python string),
    ``"@name"`` being a local resource (``@minilm``, ``@tiny-bert``, ``@tiny-neobert``, ``@official-neobert``,
    ``@embedder``); ``extra``: options appended to a command (``"train-contrastive": [...]``), only to
    make it small; ``edits``: raw text replacements in a Python block; ``skip``: lines that start with
    a key are not run, for the stated reason (their ``neobert-embed`` arguments are still parsed);
    ``check(ctx)``: what the text states about the result; ``with_server``: the block talks to the
    server started by the block before it; ``exit_code``: what its commands exit with (a transcript of
    an error). Every substitution, addition, edit and skip must be used.
    """

    group: str
    subs: dict[str, str] = field(default_factory=dict)
    extra: dict[str, list[str]] = field(default_factory=dict)
    edits: dict[str, str] = field(default_factory=dict)
    skip: dict[str, str] = field(default_factory=dict)
    check: Callable | None = None
    with_server: bool = False
    exit_code: int = 0


@dataclass
class NotRun:
    """A block that cannot run here, and why; ``covered_by`` names tests (``file::function``) that run
    the same thing at small scale (checked to exist). Its ``neobert-embed`` lines are still parsed."""

    reason: str
    covered_by: tuple[str, ...] = ()


@dataclass
class Outcome:
    """What one run line produced."""

    line: str
    stdout: str = ""
    stderr: str = ""
    value: object = None
    seconds: float = 0.0


@dataclass
class Context:
    """Handed to every check: the workspace, the block, and what its lines produced (in order)."""

    ws: Path
    block: Block
    outcomes: list[Outcome]
    groups: dict[str, list[Outcome]]  # every outcome of the group so far, by block id

    def output(self, startswith: str) -> Outcome:
        """The outcome of the block's line that starts with ``startswith``."""
        found = [o for o in self.outcomes if o.line.startswith(startswith)]
        assert found, f"{self.block.where()}: no line starting with {startswith!r} ran"
        return found[0]


@dataclass
class Step:
    block_id: str
    block: Block
    entry: Run
    kind: str  # cli | curl | python | check
    payload: object = None


def resolve(value: str, resources) -> str:
    return str(resources(value[1:])) if value.startswith("@") else value


def steps_of(block_id: str, block: Block, entry: Run) -> list[Step]:
    if block.lang == "python":
        return [Step(block_id, block, entry, "python", block.text), Step(block_id, block, entry, "check")]
    steps = []
    for tokens in ([] if block.lang == "yaml" else command_lines(block)):
        steps.append(Step(block_id, block, entry, "cli" if cli_args(tokens) is not None else tokens[0], tokens))
    return [*steps, Step(block_id, block, entry, "check")]


class GroupRun:
    """Runs the blocks of one group in a prepared workspace."""

    def __init__(self, ws: Path, resources):
        self.ws, self.resources = ws, resources
        self.outcomes: dict[str, list[Outcome]] = {}
        self.used: dict[str, set[str]] = {}
        self.ran: dict[tuple[str, ...], Outcome] = {}

    # -- driving ---------------------------------------------------------------------------------

    def run(self, blocks: list[tuple[str, Block, Run]]) -> None:
        steps = [step for block_id, block, entry in blocks for step in steps_of(block_id, block, entry)]
        with cwd(self.ws):
            self._execute(steps, server=None)
        for block_id, _, entry in blocks:
            unused = {*entry.subs, *entry.extra, *entry.edits, *entry.skip} - self.used.get(block_id, set())
            assert not unused, f"{block_id}: substitutions/skips never used (stale table entry): {sorted(unused)}"

    def _execute(self, steps: list[Step], server: str | None) -> None:
        i = 0
        while i < len(steps):
            step = steps[i]
            if step.kind == "cli" and cli_args(step.payload)[:1] == ["serve"] and server is None:
                end = i + 1
                while end < len(steps) and (steps[end].block_id == step.block_id or steps[end].entry.with_server):
                    end += 1
                self._serve(step, steps[i + 1:end])
                i = end
                continue
            self._do(step, server)
            i += 1

    def _do(self, step: Step, server: str | None) -> None:
        started = time.perf_counter()
        count = len(self.outcomes.setdefault(step.block_id, []))
        try:
            self._do_step(step, server)
        finally:
            for outcome in self.outcomes[step.block_id][count:]:
                if outcome.seconds:
                    continue
                outcome.seconds = time.perf_counter() - started
                print(f"{outcome.seconds:6.1f}s  {step.block.where()}  {outcome.line[:100]}")

    def _do_step(self, step: Step, server: str | None) -> None:
        outcomes = self.outcomes.setdefault(step.block_id, [])
        where = f"{step.block_id} ({step.block.where()})"
        if step.kind == "check":
            if step.entry.check is not None:
                step.entry.check(Context(self.ws, step.block, outcomes, self.outcomes))
            return
        if step.kind == "python":
            outcomes.append(self._python(step, server))
            return
        line = " ".join(step.payload)
        skipped = next((key for key in step.entry.skip if line.startswith(key)), None)
        if skipped is not None:
            self.used.setdefault(step.block_id, set()).add(skipped)
            return
        if step.kind == "curl":
            assert server, f"{where}: `{line}` needs the server a `neobert-embed serve` line starts"
            outcomes.append(_curl(step.payload, server, where))
            return
        if step.kind != "cli" or step.payload[0] == "torchrun":
            raise AssertionError(f"{where}: no way to run `{line}`; run it or name it in the block's skip with a reason")
        outcomes.append(self._cli(step, line, where))

    # -- the kinds of lines --------------------------------------------------------------------

    def _cli_words(self, step: Step) -> list[str]:
        args = cli_args(step.payload)
        args = concrete(args, keep_optional=False) if is_synopsis(args) else list(args)
        used = self.used.setdefault(step.block_id, set())
        out = []
        for word in args:
            if word in step.entry.subs:
                used.add(word)
                word = resolve(step.entry.subs[word], self.resources)
            out.append(word)
        for command, more in step.entry.extra.items():
            if " ".join(out).startswith(command + " ") and not set(more) & set(out):
                used.add(command)
                out += more
        return out

    def _cli(self, step: Step, line: str, where: str) -> Outcome:
        args = self._cli_words(step)
        if tuple(args) in self.ran:  # the same line in two blocks of one workspace (README and docs/): run once
            earlier = self.ran[tuple(args)]
            return Outcome(line, earlier.stdout, earlier.stderr, value="same as an earlier line", seconds=1e-9)
        code, out, err, trace = run_console_script(args)
        if code != step.entry.exit_code:
            raise AssertionError(f"{where}: `{line}` (run as `neobert-embed {shlex.join(args)}`) exited {code}, "
                                 f"not {step.entry.exit_code}:\n{out[-3000:]}\n{err[-4000:]}\n{trace}")
        self.ran[tuple(args)] = Outcome(line, out, err)
        return self.ran[tuple(args)]

    def _python(self, step: Step, server: str | None) -> Outcome:
        code = step.payload
        used = self.used.setdefault(step.block_id, set())
        for old, new in step.entry.edits.items():
            assert old in code, f"{step.block_id}: edit {old!r} no longer applies"
            used.add(old)
            code = code.replace(old, new)
        for word, value in step.entry.subs.items():
            for quoted in (f'"{word}"', f"'{word}'"):
                if quoted in code:
                    used.add(word)
                    code = code.replace(quoted, repr(resolve(value, self.resources)))
        if server:
            code = _to_server(code, server)
        tree = ast.parse(code, filename=step.block.where())
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        namespace: dict = {"__name__": "__docs_example__"}
        exec(compile(tree, step.block.where(), "exec"), namespace)
        value = eval(compile(ast.Expression(last.value), step.block.where(), "eval"), namespace) if last else None
        return Outcome(step.block.first, value=(value, namespace))

    def _serve(self, step: Step, clients: list[Step]) -> None:
        """Run the serve line through the CLI; its uvicorn.run serves on a free port while ``clients`` run."""
        import httpx
        import uvicorn
        from serve_helpers import server_thread

        failure: list[BaseException] = []

        def run_clients(app, **_):
            try:
                with server_thread(app) as url:
                    health = httpx.get(f"{url}/health", timeout=60)
                    assert health.status_code == 200, f"{step.block_id}: /health answered {health.status_code}"
                    self.outcomes.setdefault(step.block_id, []).append(
                        Outcome("GET /health", health.text, value=health.json()))
                    self._execute(clients, server=url)
            except BaseException as exc:  # reported after the CLI returns
                failure.append(exc)

        original, uvicorn.run = uvicorn.run, run_clients
        sigterm = signal.getsignal(signal.SIGTERM)  # serve installs its own SIGTERM handler
        try:
            self._do(step, server="(starting)")
        finally:
            uvicorn.run = original
            signal.signal(signal.SIGTERM, sigterm)
        if failure:
            raise failure[0]


def run_console_script(args: list[str]) -> tuple[int, str, str, str]:
    """``neobert-embed ARGS`` in-process, through the console script's own ``main()`` (its one-line
    errors and exit statuses); returns (status, stdout, stderr, traceback of an uncaught exception)."""
    from unittest import mock

    from neobert_embed.cli import main

    out, err, trace = io.StringIO(), io.StringIO(), ""
    with mock.patch.object(sys, "argv", ["neobert-embed", *args]), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except Exception:
            code, trace = -1, traceback.format_exc()
    return code, out.getvalue(), err.getvalue(), trace


def _to_server(text: str, server: str) -> str:
    host_port = server.removeprefix("http://")
    return re.sub(rf"(localhost|127\.0\.0\.1):{DOCUMENTED_PORT}", host_port, text)


def _curl(tokens: list[str], server: str, where: str) -> Outcome:
    """Send what ``curl`` would send for these words; the answer must be 2xx JSON."""
    import httpx

    url, headers, data, method = None, {}, None, None
    words = iter(tokens[1:])
    for word in words:
        if word in ("-s", "--silent", "-S", "--show-error"):
            continue
        if word in ("-H", "--header"):
            name, value = next(words).split(":", 1)
            headers[name.strip()] = value.strip()
        elif word in ("-d", "--data", "--data-raw"):
            data = next(words)
        elif word in ("-X", "--request"):
            method = next(words)
        elif word.startswith("-"):
            raise AssertionError(f"{where}: curl option {word} is not emulated by this test")
        else:
            url = word
    url = _to_server(url if "://" in url else f"http://{url}", server)
    if data is not None and not any(name.lower() == "content-type" for name in headers):
        headers["Content-Type"] = "application/x-www-form-urlencoded"  # what curl -d sends
    answer = httpx.request(method or ("POST" if data is not None else "GET"), url, headers=headers,
                           content=None if data is None else data.encode(), timeout=300)
    line = " ".join(tokens)
    assert 200 <= answer.status_code < 300, f"{where}: `{line}` answered {answer.status_code}: {answer.text[:2000]}"
    return Outcome(line, answer.text, value=answer.json())


@contextlib.contextmanager
def cwd(path: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def digits_pattern(line: str) -> re.Pattern:
    """``line`` as a regular expression in which every number may differ."""
    return re.compile(re.sub(r"\\?\d+(\\\.\d+)?", r"\\d+(?:\\.\\d+)?", re.escape(line.strip())))


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
