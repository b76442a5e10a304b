"""Records: the small JSON files by which a command says what it was asked, reached or wrote.

Why one module: a rerun, a resume, an ``--overwrite`` and ``index search`` all read back what an
earlier command wrote, and each area used to name, write and read its own files its own way (a
damaged one was sometimes a located error, sometimes a traceback, and ``manifest.json`` meant three
different things). Here every kind of record is declared once, as a :class:`RecordFile` naming
its file, what it holds and what to do when it is damaged, and is written (atomically, indented
JSON) and read (one located one-line error for a damaged file, a wrong top-level type or a bad
field) by the same code. Records written under an older name are still read (``legacy``).

The format of every record is one JSON value, an object unless the kind says otherwise; a record
that pins an output's parts also lists them under ``written`` (see
:func:`~neobert_embed.files.atomic_directory`).

Example:
    >>> RUN.write("runs/x", {"model": "bert"})
    >>> RUN.read("runs/x")
    {'model': 'bert'}
    >>> CHECKPOINT_MANIFEST.read("runs/x/checkpoints/step-10")   # a cut-short file
    Traceback (most recent call last):
    UserInputError: runs/x/checkpoints/step-10/checkpoint.json:3: damaged checkpoint manifest (invalid JSON: ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_write_json, read_json

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")
J = TypeVar("J", dict[str, Any], list[Any])  # the JSON type at a record's top level
Object = dict[str, Any]
RESTORE = "restore it from a copy, or remove it to start that part over"


@dataclass(frozen=True)
class RecordFile(Generic[J]):
    """One kind of record: its file name, what it holds (for messages) and how to repair it.

    ``legacy`` lists names the same record had in earlier versions; reading falls back to them
    and an output carrying one is still recognised as this command's own. A legacy name can be
    another record's current one (``manifest.json`` is an index's manifest now): ``legacy_key`` is
    a key such a file must hold to count as this record, so an index folder is never taken for a
    prepared corpus (and replaced by one). ``shape`` is the JSON type of the top level (``dict`` for
    all but the demo's journal, a list of stages).

    Example:
        >>> TRAINER_STATE.path("runs/x/checkpoints/step-10")
        PosixPath('runs/x/checkpoints/step-10/trainer_state.json')
    """

    name: str
    holds: str
    fix: str = RESTORE
    legacy: tuple[str, ...] = ()
    shape: type[J] = dict  # type: ignore[assignment]  (a record is an object unless it says otherwise)
    legacy_key: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every file name this record has had, current first (what ownership checks accept)."""
        return (self.name, *self.legacy)

    def path(self, directory: str | Path) -> Path:
        """Where the record of ``directory`` is: the current name, or a legacy one that is this record's."""
        directory = Path(directory)
        if (directory / self.name).is_file():
            return directory / self.name
        return next((directory / name for name in self.legacy if self._is_mine(directory / name)), directory / self.name)

    def exists(self, directory: str | Path) -> bool:
        """Whether ``directory`` carries this record (under its name, or a legacy name holding it)."""
        return self.path(directory).is_file()

    def _is_mine(self, legacy_file: Path) -> bool:
        """A file under a legacy name is this record unless ``legacy_key`` says otherwise (a file that
        cannot be read is not taken for this record: it may be another command's)."""
        if not legacy_file.is_file():
            return False
        if self.legacy_key is None:
            return True
        try:
            data = read_json(legacy_file, self.holds, self.fix)
        except UserInputError:
            return False
        return isinstance(data, dict) and self.legacy_key in data

    def read(self, directory: str | Path) -> J | None:
        """The record in ``directory`` (None when there is none); a damaged one is a located error."""
        path = self.path(directory)
        return read_record(path, self.holds, self.fix, self.shape) if path.is_file() else None

    def validate(self, directory: str | Path, model: type[M]) -> M:
        """The record parsed into the pydantic ``model`` (see :func:`validate_record`).

        Example:
            >>> INDEX_MANIFEST.validate("runs/news-index", IndexManifest).factory
            'IVF1024,Flat'
        """
        return validate_record(self.path(directory), model, self.holds, self.fix)

    def write(self, directory: str | Path, data: Mapping[str, Any] | Sequence[Any]) -> Path:
        """Write the record into ``directory`` atomically, under its current name; returns its path."""
        path = Path(directory) / self.name
        atomic_write_json(path, dict(data) if isinstance(data, Mapping) else list(data))
        return path


def read_record(path: str | Path, holds: str, fix: str = RESTORE, shape: type = dict) -> Any:
    """The JSON value in the record file ``path``, whose top level must be a ``shape`` (an object
    unless said otherwise); a damaged file or another top level is one error naming the file, then ``fix``.

    Example:
        >>> read_record("runs/demo/stages.json", "demo journal", shape=list)[0]["stage"]
        'pretrain'
    """
    data = read_json(path, holds, fix)
    if not isinstance(data, shape):
        raise UserInputError(f"{path}: damaged {holds} (a JSON {_json_type(shape)} was expected, got "
                             f"{_json_type(type(data))}); {fix}")
    return data


def validate_record(path: str | Path, model: type[M], holds: str, fix: str = RESTORE) -> M:
    """The JSON record at ``path`` parsed into the pydantic ``model``. A missing or damaged file, a top
    level that is not an object and a bad field are each one error naming the file (the line and the
    key, for a field), then ``fix``. Every record whose fields a command uses is read through a model,
    so an edited or half-written one is refused where it is read, not met as a ``KeyError`` later.

    Example:
        >>> validate_record("runs/glue/trials/bert/rte/bs16-lr2e-05-seed0.json", TrialResult, "trial result")
        Traceback (most recent call last):
        UserInputError: runs/glue/trials/bert/rte/bs16-lr2e-05-seed0.json:3: key 'scores.accuracy': ...
    """
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"{path}: {holds} not found; {fix}")
    data = read_record(path, holds, fix)
    return check_fields(path, data, model, fix, text=path.read_text(encoding="utf-8"))


def check_fields(source: str | Path, data: Mapping[str, Any], model: type[M], fix: str = RESTORE,
                 text: str = "") -> M:
    """``data`` (read from ``source``) parsed into ``model``; a bad field is one error naming
    ``source`` (its line when ``text`` is given) and the key, then ``fix``.

    Example:
        >>> check_fields("out/STS12.json", {"neobert_embed": "x"}, ResultFile, "delete it")
        Traceback (most recent call last):
        UserInputError: out/STS12.json: key 'neobert_embed': Input should be a JSON object; delete it
    """
    from neobert_embed.recipes import Spec

    try:
        return Spec(str(source), dict(data), text).validate(model)
    except UserInputError as exc:
        raise UserInputError(f"{exc}; {fix}") from None


def _json_type(kind: type) -> str:
    return {dict: "object", list: "array", str: "string", int: "number", float: "number",
            bool: "boolean", type(None): "null"}.get(kind, kind.__name__)


# Run directories (see neobert_embed.runs): settings, checked by every resume.
RUN: RecordFile[Object] = RecordFile("run.json", "run record", "resume with a copy of it, or start a new --output")
TRIAL_MODEL: RecordFile[Object] = RecordFile("model.json", "trial folder's model record",
                                             "remove that trials/<model> folder to run its trials again")
# Work in progress, in a hidden sibling of the output until the job finishes.
PREPARE_STATE: RecordFile[Object] = RecordFile("prepare.json", "corpus-preparation state",
                                               "remove it to prepare the corpus over")
INDEX_BUILD_STATE: RecordFile[Object] = RecordFile("build_state.json", "index build state",
                                                   "rerun with --overwrite to build the index over")
# Finished outputs: what they hold and how they were made.
INDEX_MANIFEST: RecordFile[Object] = RecordFile("manifest.json", "index manifest",
                                                "rebuild the index with `neobert-embed index build`")
CORPUS_SHARDS_KEY = "shards"  # a prepared corpus's manifest: its shard files, in order
CORPUS_MANIFEST: RecordFile[Object] = RecordFile(
    "corpus.json", "prepared-corpus manifest",
    "delete that folder and prepare the corpus again with `neobert-embed pretrain prepare`",
    legacy=("manifest.json",), legacy_key=CORPUS_SHARDS_KEY)
CHECKPOINT_MANIFEST: RecordFile[Object] = RecordFile("checkpoint.json", "checkpoint manifest",
                                                     "resume from an earlier checkpoint", legacy=("manifest.json",))
# Step, stream position and engine of a pretraining checkpoint; transformers' Trainer writes one of the same
# name in its checkpoints (train-contrastive), last, so its presence marks a complete one.
TRAINER_STATE: RecordFile[Object] = RecordFile("trainer_state.json", "trainer state",
                                               "resume from an earlier checkpoint")
EXPORT: RecordFile[Object] = RecordFile("export.json", "export record", "export the model again with --overwrite")
CONVERT: RecordFile[Object] = RecordFile("convert.json", "conversion record",
                                         "convert the checkpoint again with --overwrite")
DEMO_JOURNAL: RecordFile[list[Any]] = RecordFile("stages.json", "demo journal", "remove it to run every stage again",
                                                 shape=list)
BEST_TRIAL: RecordFile[Object] = RecordFile("best.json", "best-trial record",
                                            "remove that models/<model>/<task> folder to select again")
TRAINING_SUMMARY: RecordFile[Object] = RecordFile("summary.json", "training summary", "train again with --overwrite")
# Written for people and scripts, never read back by the toolkit.
GLUE_SCORES: RecordFile[Object] = RecordFile("scores.json", "GLUE scores")
MTEB_PROTOCOL: RecordFile[Object] = RecordFile("protocol.json", "evaluation protocol")
DEMO_SUMMARY: RecordFile[Object] = RecordFile("summary.json", "demo summary", "rerun `neobert-embed demo`")

RECORDS: tuple[RecordFile[Any], ...] = (RUN, TRIAL_MODEL, PREPARE_STATE, INDEX_BUILD_STATE, INDEX_MANIFEST,
                                        CORPUS_MANIFEST, CHECKPOINT_MANIFEST, TRAINER_STATE, EXPORT, CONVERT,
                                        DEMO_JOURNAL, BEST_TRIAL, TRAINING_SUMMARY, GLUE_SCORES, MTEB_PROTOCOL,
                                        DEMO_SUMMARY)
