"""The files of one batch call, in its directory under the shared directory.

::

    <shared_dir>/<SeD name>/
        history.jsonl           past run times (one JSON object per finished job)
        jobs/<call id>/
            meta.json           the SeD's record: call, job id, state (rewritten atomically)
            call.json           service target and arguments (the value codec's JSON tree)
            args.bin            the arguments' binary parts (numpy arrays, bytes), concatenated
            files/              files sent with the call (services get their paths)
            job.sh, job.out     the job script and its output (stdout + stderr)
            started.json        written by the job when it starts (job id, host, time)
            result.json/.bin    written by the job: the result (codec tree + binary parts), or
            error.json          the exception the service raised (type, message, traceback)
            reply.json/.bin     an answer kept for a client that has not asked for it yet

Values cross the disk in the same format as the wire (the codec's JSON tree
plus raw buffers): no pickle, so reading a result never runs code. JSON files
are written to a temporary name and renamed, so a reader sees all or nothing;
``result.json`` is renamed last, after ``result.bin``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core import codec
from ...files import FilePath, safe_file_name

__all__ = ["safe_name", "write_json", "read_json", "read_started", "write_buffers", "read_buffers",
           "write_call", "read_call", "write_result", "write_error", "read_outcome", "Outcome",
           "tail", "write_reply", "read_reply", "LaterFiles", "write_files", "write_script"]


def safe_name(text: str, limit: int = 80) -> str:
    """A file-name-safe version of *text* (call ids, SeD names); unsafe or
    overlong names get a hash suffix so distinct inputs stay distinct."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:limit]
    if clean != text or not clean or clean in (".", ".."):
        clean = f"{clean[:limit - 13]}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    return clean


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Atomic write (temp file + rename) in the same directory."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, allow_nan=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as fh:
        return json.load(fh)


def read_started(d: str | os.PathLike) -> dict:
    """What the job wrote in ``started.json`` when it began (job id, host,
    times), or ``{}`` when it has not started or the file is unreadable."""
    try:
        v = read_json(os.path.join(d, "started.json"))
    except (OSError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


def write_buffers(path: str | os.PathLike, buffers: list) -> list[int]:
    """Concatenate binary parts into *path* (atomically); return their sizes."""
    path = Path(path)
    sizes = []
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            for b in buffers:
                mv = memoryview(b).cast("B") if not isinstance(b, bytes) else b
                fh.write(mv)
                sizes.append(len(mv))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return sizes


def read_buffers(path: str | os.PathLike, sizes: list[int]) -> list[memoryview]:
    if not sizes:
        return []
    data = memoryview(Path(path).read_bytes())
    if len(data) != sum(sizes):
        raise ValueError(f"{path}: {len(data)} bytes, expected {sum(sizes)}")
    out, pos = [], 0
    for n in sizes:
        out.append(data[pos:pos + n])
        pos += n
    return out


# -- the call (SeD -> job) ------------------------------------------------------

def write_call(d: str | os.PathLike, *, target: str, service: str, call_id: str,
               args: list, kwargs: dict) -> None:
    """The call's arguments, encoded like on the wire (files are already local
    paths in ``files/``). Raises InvalidArgument for values the codec refuses."""
    from ...files import read_file
    buffers: list = []
    tree_args = codec.encode(list(args), buffers, read_file)
    tree_kwargs = codec.encode(dict(kwargs), buffers, read_file)
    sizes = write_buffers(Path(d) / "args.bin", buffers)
    write_json(Path(d) / "call.json", {"v": 1, "target": target, "service": service, "call_id": call_id,
                                       "args": tree_args, "kwargs": tree_kwargs, "sizes": sizes})


def read_call(d: str | os.PathLike) -> tuple[dict, list, dict]:
    """``(meta, args, kwargs)`` of a call directory (on the compute node)."""
    from ...files import FileSink
    meta = read_json(Path(d) / "call.json")
    buffers = read_buffers(Path(d) / "args.bin", meta.get("sizes") or [])
    sink = FileSink(str(Path(d) / "files"), as_path=True)
    args = codec.decode(meta["args"], buffers, sink)
    kwargs = codec.decode(meta["kwargs"], buffers, sink)
    return meta, args, kwargs


# -- the outcome (job -> SeD) ---------------------------------------------------

def write_result(d: str | os.PathLike, value: Any, **info: Any) -> None:
    from ...files import read_file
    buffers: list = []
    tree = codec.encode(value, buffers, read_file)
    sizes = write_buffers(Path(d) / "result.bin", buffers)
    write_json(Path(d) / "result.json", {"v": 1, "value": tree, "sizes": sizes, **info})


def write_error(d: str | os.PathLike, type_: str, message: str, traceback: str, **info: Any) -> None:
    write_json(Path(d) / "error.json", {"v": 1, "type": type_, "message": message,
                                        "traceback": traceback, **info})


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What the job left: a result (``ok``: ``value`` tree + ``buffers``) or
    the service's exception (``type``, ``message``, ``traceback``)."""
    ok: bool
    value: Any = None
    buffers: tuple = ()
    type: str = ""
    message: str = ""
    traceback: str = ""
    started: float | None = None     # service start/end as seen inside the job
    ended: float | None = None
    host: str | None = None


def read_outcome(d: str | os.PathLike) -> Outcome | None:
    """The job's result or error, ``None`` if it wrote neither (yet)."""
    d = Path(d)
    try:
        r = read_json(d / "result.json")
    except FileNotFoundError:
        r = None
    if r is not None:
        buffers = read_buffers(d / "result.bin", r.get("sizes") or [])
        return Outcome(ok=True, value=r.get("value"), buffers=tuple(buffers), started=r.get("started"),
                       ended=r.get("ended"), host=r.get("host"))
    try:
        e = read_json(d / "error.json")
    except FileNotFoundError:
        return None
    return Outcome(ok=False, type=str(e.get("type") or "Exception"), message=str(e.get("message") or ""),
                   traceback=str(e.get("traceback") or ""), started=e.get("started"),
                   ended=e.get("ended"), host=e.get("host"))


def tail(path: str | os.PathLike, limit: int = 2000) -> str:
    """The last *limit* bytes of a text file ('' if missing)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode(errors="replace")
    return ("..." if size > limit else "") + text


# -- answers kept for later (client away, e.g. across a SeD restart) ---------------

def write_reply(d: str | os.PathLike, header: dict, buffers: list) -> None:
    sizes = write_buffers(Path(d) / "reply.bin", buffers)
    write_json(Path(d) / "reply.json", {"header": header, "sizes": sizes})


def read_reply(d: str | os.PathLike) -> tuple[dict, list] | None:
    try:
        r = read_json(Path(d) / "reply.json")
    except FileNotFoundError:
        return None
    return r["header"], read_buffers(Path(d) / "reply.bin", r.get("sizes") or [])


# -- files sent with a call, written when its job is prepared (off the SeD's loop) --------

class LaterFiles:
    """The codec's file writer for a batch call: gives each file its path in
    the call's directory now, writes it later, off the loop, with the call."""

    def __init__(self, directory: str, pending: list) -> None:
        self.directory, self.pending = directory, pending

    def __call__(self, ref) -> str:
        path = FilePath(os.path.join(self.directory, f"f{len(self.pending)}-{safe_file_name(ref.name)}"))
        self.pending.append((path, ref.data))
        return path


def write_files(files: list) -> None:
    for path, data in files:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)


def write_script(d: str, script: str) -> None:
    try:
        with open(os.path.join(d, "job.sh"), "w") as fh:
            fh.write(script)
    except OSError:
        pass
