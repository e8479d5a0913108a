"""``gridrpc.File``: a file whose *content* travels with a call.

On the client, ``File(path)`` is read and sent as a binary frame; the service
receives the path (``str``) of a local copy. A service may return
``File(path)``: the client then gets a ``File`` pointing to a local copy in its
download directory.

A service parameter annotated ``gridrpc.File`` accepts only files sent with
the call: the SeD refuses a plain string there, so a caller cannot make the
service open a path of the server's own (``/etc/shadow``, the SeD's keys).
The service still receives a ``str``: a :class:`FilePath`, the path of the
copy the SeD wrote in the call's own directory.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from .core.codec import FileRef


class File:
    __gridrpc_file__ = True
    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def read_bytes(self) -> bytes:
        return Path(self.path).read_bytes()

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"gridrpc.File({self.path!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, File) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)


class FilePath(str):
    """The path of a file received with a call, in the call's directory. Only
    the SeD's file writers make these (never a value from a message), which is
    what lets a ``gridrpc.File`` parameter tell a sent file from a string."""
    __slots__ = ()


def is_sent_file(value: object) -> bool:
    """Whether ``value`` is a file sent with the call (a received copy, or a
    :class:`File` where the back-end hands services ``File`` objects)."""
    return isinstance(value, (FilePath, File))


def read_file(f: File) -> FileRef:
    try:
        return FileRef(name=f.name, data=Path(f.path).read_bytes())
    except OSError as exc:
        from .errors import InvalidArgument
        raise InvalidArgument(f"cannot read {f.path}: {exc}") from exc


def safe_file_name(sent_name: object) -> str:
    """The sender's file name kept only as a hint (the extension matters to
    solvers): at most 64 safe characters of its base name, never a path."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(str(sent_name)))[-64:].lstrip(".") or "file"


class FileSink:
    """Writes received files into a directory; ``as_path`` gives services a str."""

    def __init__(self, directory: str | None = None, as_path: bool = False) -> None:
        self.directory = directory
        self.as_path = as_path

    def __call__(self, ref: FileRef):
        d = self.directory or tempfile.mkdtemp(prefix="gridrpc-files-")
        os.makedirs(d, exist_ok=True)
        name = safe_file_name(ref.name)          # the path itself is chosen here
        fd, path = tempfile.mkstemp(prefix="", suffix="-" + name, dir=d)
        with os.fdopen(fd, "wb") as fh:
            fh.write(ref.data)
        return FilePath(path) if self.as_path else File(path)
