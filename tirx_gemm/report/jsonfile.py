"""The one reader of the JSON files a user may hand the CLI (a GPU baseline, the build
expectations, a recorded trace): the file read as UTF-8 text, parsed, and its top level
checked to be an object, or a one-line ValueError naming the file and what it is not.
Standard library only."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["load_object"]


def load_object(path, what: str, fix: str = "") -> dict:
    """The JSON object in ``path``; ``what`` ("a baseline file") and ``fix`` (", or
    re-record it with ...") complete the one-line ValueError for text that is not UTF-8,
    not JSON, nested too deeply for the parser, or not an object (a list, a string).
    OSError (a missing or unreadable file) passes through: it names the file itself."""
    path = Path(path)

    def refuse(why: str) -> ValueError:
        return ValueError(f"{path}: not {what} ({why}){fix}")

    if path.exists() and not (path.is_file() or path.is_dir()):  # a dir: read_bytes says so
        raise refuse("not a regular file: a pipe or device is read until it closes")
    raw = path.read_bytes()

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refuse(f"not UTF-8 text, byte {exc.start}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise refuse(f"not valid JSON: {exc}") from None
    except RecursionError:  # nesting no writer of these files makes; json's parser overflows
        raise refuse("it nests too deeply") from None
    if not isinstance(data, dict):
        raise refuse(f"the top level is a JSON {_kind(data)}, not an object")
    return data


def _kind(value) -> str:
    return {list: "list", str: "string", bool: "true/false", type(None): "null"}.get(
        type(value), "number")
