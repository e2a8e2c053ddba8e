"""Reading and writing the files and folders a user names, with one-line errors.

Every path that comes from a flag or a config file (model configs, sweep and serve configs,
fixtures, prompt files, run folders, output folders) is read or written through these helpers: an
OS error (missing, a folder where a file is expected, a file where a folder is expected, no
permission, disk full) or a file that is not UTF-8 text becomes a
:class:`~mlabench.errors.FileAccessError` saying what the file is, why, and where, which the CLI
prints as one ``error:`` line with exit code 2 (3 for a full disk:
:class:`~mlabench.errors.DiskFullError`).

Configuration files too: where the shipped configuration lives (:func:`configs_dir`), finding one by
name or path (:func:`config_file`), reading TOML (:func:`read_toml`) and a pydantic validation error
as one line (:func:`validation_line`, or :func:`file_error_line` in the terms of the file read).
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import tempfile
import tomllib
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mlabench.errors import ConfigError, DiskFullError, FileAccessError


#: The errnos of a full disk or quota (:class:`~mlabench.errors.DiskFullError`).
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _reason(exc: OSError, making: bool = False) -> str:
    """What went wrong, for people; ``making``: the path was being created (a folder that cannot
    be made, e.g. under /proc, reads ENOENT as if it were missing)."""
    if isinstance(exc, FileNotFoundError):
        return "could not be created there" if making else "not found"
    if isinstance(exc, IsADirectoryError):
        return "is a folder, not a file"
    if isinstance(exc, NotADirectoryError):
        return "is not a folder (or a part of its path is a file)"
    if isinstance(exc, FileExistsError):
        return "exists already as a file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if exc.errno in _DISK_FULL:
        return "could not be written: the disk is full (no space left on device)"
    return exc.strerror or type(exc).__name__


def _access_error(exc: OSError) -> type[FileAccessError]:
    """The error class for ``exc``: :class:`~mlabench.errors.DiskFullError` (exit 3) for a full disk
    or quota, else :class:`FileAccessError`."""
    return DiskFullError if exc.errno in _DISK_FULL else FileAccessError


@contextmanager
def user_path(path: str | Path, what: str, making: bool = False) -> Iterator[None]:
    """Run the block; an ``OSError`` or ``UnicodeError`` inside it becomes a
    :class:`FileAccessError` like ``sweep config not found: x.toml``.

    ``what`` names the file for people (``"model config"``, ``"run folder"``); ``making``: the
    block creates ``path`` (a folder), so ENOENT means it could not be made.  A folder on the way
    that fails is always one being made (the writers create their folders).
    """
    try:
        yield
    except UnicodeError:
        raise FileAccessError(f"{what} is not a text file (not UTF-8): {path}") from None
    except OSError as exc:
        error = _access_error(exc)
        culprit = Path(exc.filename) if isinstance(exc.filename, str) else None
        if culprit is not None and culprit in Path(path).parents:  # a folder on the way is in the way
            raise error(f"{what} {path}: its folder {culprit} {_reason(exc, True)}") from None
        raise error(f"{what} {_reason(exc, making)}: {path}") from None


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path`` (gunzipped when its name ends in ``.gz``); :class:`FileAccessError`
    when it cannot be read as text, or is not a whole gzip stream (cut short, corrupt, not gzip,
    empty: 0 bytes)."""
    with user_path(path, what):
        if Path(path).suffix != ".gz":
            return Path(path).read_text(encoding="utf-8")
        data = Path(path).read_bytes()
        if not data:  # gzip reads 0 bytes as no text: a run with no records, where a file was lost
            raise FileAccessError(f"{what} is empty (0 bytes, not a gzip file): {path}")
        try:
            return gzip.decompress(data).decode("utf-8")
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:  # EOFError would read as Ctrl-C to Click
            why = "cut short" if isinstance(exc, EOFError) else str(exc) or type(exc).__name__
            raise FileAccessError(f"{what} is not a whole gzip file ({why}): {path}") from None


def read_json(path: str | Path, what: str) -> Any:
    """The JSON value in ``path``; :class:`FileAccessError` when it cannot be read or parsed."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise FileAccessError(f"{what} is not valid JSON ({exc}): {path}") from None


def write_text(path: str | Path, text: str, what: str, atomic: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path``, creating its folder; with ``atomic`` through a temporary
    file renamed over it (removed again when the write fails, e.g. on a full disk).
    :class:`FileAccessError` when it cannot be written."""
    return write_bytes(path, text.encode("utf-8"), what, atomic)


def check_writable(path: str | Path, what: str) -> None:
    """Refuse, before any work, a file ``path`` that :func:`write_text` could not write later: a
    folder at ``path``, a file in the way of its folder, an existing file that cannot be opened for
    writing, or a nearest existing folder that takes no new file: no permission, or none at all
    (``/proc``) (:class:`FileAccessError`, one line).  The folder is probed with a file made there
    and removed at once; an existing file is opened for appending, nothing written: nothing is
    left behind or changed."""
    p = Path(path)
    if p.is_dir():
        raise FileAccessError(f"{what} {p} is a folder: give a file name")
    folder = next(a for a in p.absolute().parents if a.exists())
    if not folder.is_dir():
        raise FileAccessError(f"{what} {p}: its folder {folder} is a file")
    exists = p.exists()
    try:
        if exists:
            os.close(os.open(p, os.O_WRONLY | os.O_APPEND))
            return
        fd, probe = tempfile.mkstemp(prefix=".mlabench-probe-", dir=folder)
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            raise DiskFullError(f"{what} {p}: {_reason(exc)}") from None
        if isinstance(exc, PermissionError):
            raise FileAccessError(f"{what} {p}: permission denied") from None
        if exists:
            raise FileAccessError(f"{what} {p}: cannot be opened for writing ({_reason(exc)})") from None
        why = "" if isinstance(exc, FileNotFoundError) else f" ({_reason(exc)})"
        raise FileAccessError(f"{what} {p}: nothing can be created in {folder}{why}") from None
    try:
        os.close(fd)
    finally:
        with user_path(probe, f"{what}'s probe file"):
            os.unlink(probe)


def write_bytes(path: str | Path, data: bytes, what: str, atomic: bool = False) -> Path:
    """Write ``data`` to ``path``, creating its folder, with ``atomic`` as :func:`write_text` does;
    :class:`FileAccessError` on failure.  A write that fails (a full disk, Ctrl-C) removes the
    file it was making: the temporary one, or ``path`` where it did not exist before (a report's
    0-byte leftover was then refused as "no mlabench report": a fresh user's review)."""
    p = Path(path)
    target = p.with_name(p.name + ".tmp") if atomic else p
    with user_path(p, what):
        p.parent.mkdir(parents=True, exist_ok=True)
        made = atomic or not p.exists()
        try:
            _write_file(target, data, os.O_TRUNC)
        except BaseException:
            if made and target.is_file():
                target.unlink()
            raise
        if atomic:
            target.replace(p)
    return p


def append_text(path: str | Path, text: str, what: str, sync: bool = False) -> None:
    """Append ``text`` to ``path`` whole or not at all (fsync'ed with ``sync``).

    A write cut short (a full disk) is cut back off before :class:`FileAccessError` is raised, so a
    JSONL file never keeps a torn line; several processes appending to one file hold a lock around
    this call (:func:`mlabench.tune.worker_pool.append_shared`).
    """
    with user_path(path, what):
        _write_file(Path(path), text.encode("utf-8"), os.O_APPEND, sync)


def _write_file(path: Path, data: bytes, mode: int, sync: bool = False) -> None:
    """Write ``data`` into ``path`` opened with ``mode`` (``os.O_TRUNC`` or ``os.O_APPEND``); on
    any failure the file is truncated back to its size before, and the ``OSError`` re-raised."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o666)
    try:
        start = os.fstat(fd).st_size if mode == os.O_APPEND else 0
        try:
            view = memoryview(data)
            while view:  # os.write may write less than asked (a disk filling up)
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def make_dir(path: str | Path, what: str, exist_ok: bool = True) -> Path:
    """Create the folder ``path`` (and its parents); :class:`FileAccessError` when it cannot be made
    (a file in the way, no permission).  Without ``exist_ok`` an existing folder raises
    ``FileExistsError`` as :func:`os.mkdir` does, so that callers can pick another name."""
    p = Path(path)
    if not exist_ok:
        make_dir(p.parent, what)
        try:
            p.mkdir()
        except FileExistsError:
            raise
        except OSError as exc:
            raise _access_error(exc)(f"{what} {_reason(exc, True)}: {p}") from None
        return p
    with user_path(p, what, making=True):
        p.mkdir(parents=True, exist_ok=True)
    return p


def configs_dir() -> Path:
    """Folder holding ``models/``, ``sweeps/`` and ``serve/``: ``$MLABENCH_CONFIGS``; else, running
    from a checkout, its top-level ``configs/`` (where people edit them); else the copy an
    installed wheel carries in ``mlabench/_configs/`` (``setup.py`` puts it there)."""
    env = os.environ.get("MLABENCH_CONFIGS")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent
    checkout = package.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "configs").is_dir():
        return checkout / "configs"
    return package / "_configs"


def file_in_the_way(path: str | Path) -> str | None:
    """``its folder X is a file`` where a folder on the way to ``path`` (which does not exist) is a
    file, so that the error says so (it read "not found"); None otherwise."""
    file_above = next((a for a in Path(path).parents if a.is_file()), None)
    return f"its folder {file_above} is a file" if file_above else None


def config_file(name_or_path: str | Path, kind: str, what: str) -> Path:
    """The config file ``name_or_path`` names: a path to a file, or a bare name (no folder; with
    or without ``.toml``) of ``configs/<kind>/<name>.toml`` (``kind``: ``models``, ``sweeps`` or ``serve``).

    Raises :class:`ConfigError` for a path that does not exist, or a bare name that is neither a
    file here nor a shipped config, listing the shipped ones.
    """
    path = Path(name_or_path)
    if path.exists():
        return path
    if len(path.parts) == 1 and path.suffix == ".toml" and (configs_dir() / kind / path).is_file():
        return configs_dir() / kind / path  # a shipped config named with its suffix
    known = ", ".join(sorted(p.stem for p in (configs_dir() / kind).glob("*.toml"))) or "none"
    if path.suffix or len(path.parts) != 1:
        why = file_in_the_way(path)
        raise ConfigError(f"{what} not found: {path}{f': {why}' if why else ' does not exist'} (known: {known})")
    shipped = configs_dir() / kind / f"{path}.toml"
    if not shipped.is_file():
        raise ConfigError(f"{what} not found: {path} is neither a file nor a shipped {what} (known: {known})")
    return shipped


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """Parse the TOML file ``path``; :class:`ConfigError` names ``what`` when it is missing,
    unreadable, not text (:class:`~mlabench.errors.FileAccessError`) or malformed, and says so
    when it is JSON (a ``.json`` name or a leading ``{``) rather than reporting a TOML error."""
    p = Path(path)
    text = read_text(p, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        if p.suffix.lower() == ".json" or text.lstrip().startswith("{"):
            raise ConfigError(f"{p}: a {what} is TOML, not JSON (the shipped ones: configs/)") from None
        raise ConfigError(f"{p}: malformed TOML ({exc})") from None


def validation_line(exc: ValidationError) -> str:
    """The first pydantic error as ``field.path: message`` on one line."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = err.get("msg", str(exc)).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":  # pydantic's "Extra inputs are not permitted"
        msg = "unknown key (a typo?)"
    return f"{loc}: {msg}" if loc else msg


#: What a pydantic error type asked for, in words (:func:`file_error_line`); a union's members each
#: give one, joined by "or".
EXPECTED = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
            "string_type": "a string", "float_type": "a number", "float_parsing": "a number",
            "bool_type": "true or false", "bool_parsing": "true or false", "list_type": "a list",
            "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object"}
#: A number's bounds: pydantic's error type -> (its ``ctx`` key, the sign).
BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than": ("lt", "<"),
          "less_than_equal": ("le", "<=")}


def key_path(path: list[str | int]) -> str:
    """``["batches", 0, "params", "num_kv_splits"]`` as ``batches[0].params.num_kv_splits``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _data_path(err: dict[str, Any], data: Any) -> list[str | int]:
    """The part of ``err``'s location that names keys and list positions of ``data`` (a missing key
    included), without pydantic's names for a union's members or its validators."""
    path: list[str | int] = []
    node = data
    for i, part in enumerate(err.get("loc", ())):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif not (err["type"] == "missing" and i == len(err["loc"]) - 1):
            break
        path.append(part)
    return path


def _what_is_wrong(errors: list[dict[str, Any]]) -> str:
    """What the errors at one place of a file say, in words: ``expected an integer or a string, got
    [4]``, ``expected a value > 0, got -5``, ``missing (required)``, a validator's own message."""
    err = errors[0]
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "missing":
        return "missing (required)"
    if kind == "extra_forbidden":
        return "not a known key (misspelt?)"
    if kind in ("value_error", "assertion_error"):
        return err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    wanted = [EXPECTED[e["type"]] for e in errors if e["type"] in EXPECTED]
    if kind in BOUNDS:
        key, sign = BOUNDS[kind]
        wanted = [f"a value {sign} {ctx.get(key)}"]
    elif kind == "too_short":
        wanted = [f"at least {ctx.get('min_length')} item(s)"]
    got = json.dumps(err.get("input"), default=str)
    got = got if len(got) <= 60 else got[:57] + "..."
    return f"expected {' or '.join(dict.fromkeys(wanted))}, got {got}" if wanted else f"{err['msg']}, got {got}"


def file_error_line(exc: ValidationError, data: Any,
                    place: Callable[[list[str | int]], str] = key_path) -> str:
    """The first pydantic error of validating ``data`` (a file's parsed content) as one line in the
    file's terms: where (``place`` of the keys and list positions leading there; pydantic's names of
    a union's members left out) and what is wrong there, e.g.
    ``batches[0].entries[3].params.num_kv_splits: expected an integer or a string, got [4]``."""
    errors = exc.errors()
    path = _data_path(errors[0], data)
    where = place(path)
    what = _what_is_wrong([e for e in errors if _data_path(e, data) == path])
    return f"{where}: {what}" if where else what
