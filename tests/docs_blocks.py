"""The command blocks of README.md and docs/*.md, read at test time, and their command lines checked
against the real command line (``tests/test_docs_examples.py`` runs them).

A block is a fenced code block (```` ```bash ````, ```` ```python ````, an unlabelled ```` ``` ````, …) or
an indented code block (four spaces after a paragraph that is not a list item). Its id is
``"<file>: <first line>"``: the first line that is not a comment, without a trailing comment or ``\\``,
spaces collapsed (``#2`` appended when a file repeats a first line).
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<lang>[^`\s]*)")


def doc_files() -> list[Path]:
    """README.md and every page under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository: README.md, docs/indexing.md
    line: int  # 1-based line of the opening fence (of the first line of an indented block)
    lang: str  # bash, python, yaml, … ; "" unlabelled; "indented" for an indented code block
    text: str

    @property
    def first(self) -> str:
        """The first line that is not a comment, without its trailing comment, ``\\`` and extra spaces."""
        lines = [line.strip() for line in self.text.splitlines() if line.strip()]
        code = [line for line in lines if not line.startswith("#")] or lines or [""]
        line = re.sub(r"\s{2,}#.*$", "", code[0]).removesuffix("\\")
        return " ".join(line.split())

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _fenced_and_indented(lines: list[str]) -> list[tuple[int, str, str]]:
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match:
            indent, fence, lang = len(match["indent"]), match["fence"], match["lang"]
            start, body, i = i, [], i + 1
            while i < len(lines) and not re.match(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[i]):
                body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
                i += 1
            found.append((start + 1, lang, "\n".join(body)))
            i += 1
            continue
        # An indented code block: 4+ spaces after a blank line, where the paragraph above is no list item.
        if lines[i].startswith("    ") and lines[i].strip() and i > 0 and not lines[i - 1].strip():
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            top = j
            while top > 0 and lines[top - 1].strip():
                top -= 1
            paragraph_is_list = j >= 0 and (LIST_ITEM.match(lines[top]) or lines[top].startswith(" "))
            if j >= 0 and not paragraph_is_list and not FENCE.match(lines[j]):
                start, body = i, []
                while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                    body.append(lines[i][4:])
                    i += 1
                found.append((start + 1, "indented", "\n".join(body).rstrip("\n")))
                continue
        i += 1
    return found


def extract_blocks(path: Path) -> list[Block]:
    """Every code block of one markdown file, in order."""
    name = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    return [Block(name, line, lang, text)
            for line, lang, text in _fenced_and_indented(path.read_text(encoding="utf-8").splitlines())]


def all_blocks() -> dict[str, Block]:
    """Every block of README.md and docs/*.md by its id, in document order."""
    blocks: dict[str, Block] = {}
    for path in doc_files():
        for block in extract_blocks(path):
            key, n = f"{block.file}: {block.first}", 1
            while key in blocks:
                n += 1
                key = f"{block.file}: {block.first} #{n}"
            blocks[key] = block
    return blocks


# --- command lines --------------------------------------------------------------------------------


def logical_lines(text: str) -> list[str]:
    """Lines of a shell block with ``\\`` continuations joined; blank and comment-only lines left out."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined = (pending + line).strip()
        pending = ""
        if joined and not joined.startswith("#"):
            out.append(joined)
    if pending.strip():
        out.append(pending.strip())
    return out


def words(line: str) -> list[str] | None:
    """The shell words of ``line`` (comments dropped), or None when it is no shell syntax (output text)."""
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return None


def cli_args(tokens: list[str]) -> list[str] | None:
    """The ``neobert-embed`` arguments of a command: ``neobert-embed ARGS``, ``$ neobert-embed ARGS``,
    ``torchrun … -m neobert_embed.cli ARGS`` or ``python -m neobert_embed.cli ARGS``; None otherwise."""
    if tokens[:1] == ["$"]:
        tokens = tokens[1:]
    if not tokens:
        return None
    if Path(tokens[0]).name == "neobert-embed":
        return tokens[1:]
    for i in range(len(tokens) - 1):
        if tokens[i] == "-m" and tokens[i + 1] == "neobert_embed.cli":
            return tokens[i + 2:]
    return None


def command_lines(block: Block) -> list[list[str]]:
    """The shell words of every command line of a block (an unlabelled or indented block: only lines
    that are commands, so output shown beside them is skipped)."""
    lines = []
    for line in logical_lines(block.text):
        tokens = words(line)
        if not tokens:
            continue
        if block.lang in ("", "indented", "text", "console") and cli_args(tokens) is None:
            continue  # output or a file layout, not a command
        lines.append(tokens)
    return lines


def concrete(args: list[str], keep_optional: bool) -> list[str]:
    """A synopsis such as ``[--k 10] [--index-type auto|flat | --factory F]`` made concrete: without its
    bracketed parts (``keep_optional=False``, what is run) or with every one, first alternative of each
    value (``keep_optional=True``, what is parsed, so every option name is checked)."""
    out, depth = [], 0
    for token in args:
        opens, closes = token.count("["), token.count("]")
        bare = token.strip("[]")
        if token == "|" or (depth + opens > 0 and not keep_optional):
            depth += opens - closes
            continue
        depth += opens - closes
        if bare.startswith("-") or "|" not in bare:
            out.append(bare)
        else:
            out.append(bare.split("|")[0])
    return out


def is_synopsis(args: list[str]) -> bool:
    return any(token.startswith("[") for token in args)


@functools.cache
def _root_command():
    import typer

    from neobert_embed.cli import app

    return typer.main.get_command(app)


def check_cli_args(args: list[str]) -> str | None:
    """Parse ``args`` against the real CLI as click does before running a command: the command path
    exists, every option name exists, every value converts to its option's type (ranges included) and
    no positional argument is left over. Returns the problem, or None."""
    command = _root_command()
    path, ctx, rest = ["neobert-embed"], None, list(args)
    while True:
        try:
            ctx = command.make_context(" ".join(path), list(rest), parent=ctx)
        except Exception as exc:  # click's NoSuchOption / BadParameter / UsageError
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            return f"`{' '.join(path)}`: {message}"
        if not hasattr(command, "commands"):
            return None
        rest = [*(getattr(ctx, "_protected_args", None) or []), *ctx.args]
        if not rest:
            return None  # a group that runs itself (`pretrain --recipe …`)
        sub = command.commands.get(rest[0])
        if sub is None:
            return f"`{' '.join(path)}` has no command {rest[0]!r} (it has: {', '.join(sorted(command.commands))})"
        command, path, rest = sub, [*path, rest[0]], rest[1:]
