"""Command-line option values shared by several areas' commands.

Why: ``--data NAME=PATH`` is read by ``train-contrastive`` and by ``compare`` (which fine-tunes
before it evaluates); one parser keeps their rules and messages identical, and no area imports
another area's private helpers.

Example:
    >>> parse_data_option(["snli=triplets.jsonl"])
    {'snli': 'triplets.jsonl'}
"""

from __future__ import annotations

from neobert_embed.errors import UserInputError


def parse_data_option(entries: list[str]) -> dict[str, str]:
    """``--data NAME=PATH`` entries as a name → path mapping; a malformed or repeated name is refused.

    Example:
        >>> parse_data_option(["a=x.jsonl", "b=y.csv"])
        {'a': 'x.jsonl', 'b': 'y.csv'}
    """
    data: dict[str, str] = {}
    for entry in entries:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            raise UserInputError(f"--data {entry!r}: expected NAME=PATH, e.g. --data snli=triplets.jsonl")
        if name in data:
            raise UserInputError(f"--data: dataset name {name!r} is given twice; names must be unique")
        data[name] = path
    return data
