"""The Standard Workload Format (SWF) of the Parallel Workloads Archive:
a strict parser and a writer (docs/simulation-traces.md).

An SWF file is text: header comments first (``; Label: value``, e.g.
``; MaxProcs: 512``), then one job per line of 18 whitespace-separated
numbers, sorted by submit time; ``-1`` means unknown; any line starting with
``;`` is a comment. The fields, in order (:class:`SWFJob` attribute names):

 1 ``job``       job number (a counter from 1)
 2 ``submit``    submit time, seconds
 3 ``wait``      wait time, seconds
 4 ``run``       run time (wall clock), seconds
 5 ``procs``     number of allocated processors
 6 ``cpu_avg``   average CPU time used, seconds (may have a fraction)
 7 ``mem_used``  used memory, KB per processor (may have a fraction)
 8 ``req_procs`` requested number of processors
 9 ``req_time``  requested time (the user's run-time estimate), seconds
10 ``req_mem``   requested memory, KB per processor
11 ``status``    1 completed, 0 failed, 5 cancelled, 2/3/4 checkpoint parts
12 ``user``      user id
13 ``group``     group id
14 ``app``       executable (application) number
15 ``queue``     queue number
16 ``partition`` partition number
17 ``prev_job``  preceding job number
18 ``think``     think time from the preceding job, seconds

Strict means: every job line has exactly 18 numbers, integers except fields
6 and 7, none below -1, job numbers increasing, submit times not
decreasing, no job wider than the header's ``MaxProcs``; a bad line raises
:class:`SWFError` naming the file and line. A file or a job count over the
caps (``max_bytes``, ``max_jobs``) is refused before it fills the memory.
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

__all__ = ["SWFError", "SWFJob", "Trace", "parse_swf", "read_swf", "format_swf", "write_swf",
           "FIELDS", "MAX_BYTES", "MAX_JOBS", "MAX_LINE"]

#: refuse files larger than this (bytes) unless the caller raises it
MAX_BYTES = 256 * 1024 * 1024
#: refuse more job lines than this
MAX_JOBS = 2_000_000
#: a longer line is an error (18 numbers fit in far fewer characters)
MAX_LINE = 1024

#: header labels whose value must be an integer
INT_LABELS = frozenset({"MaxJobs", "MaxRecords", "MaxNodes", "MaxProcs", "MaxRuntime", "MaxMemory",
                        "UnixStartTime", "MaxQueues", "MaxPartitions"})
_FLOAT_FIELDS = frozenset({5, 6})     # 0-based: average CPU time, used memory
_STATUSES = frozenset({-1, 0, 1, 2, 3, 4, 5})


class SWFError(ValueError):
    """A line of an SWF file is not valid (``line`` is 1-based, 0 = the whole file)."""

    def __init__(self, source: str, line: int, message: str) -> None:
        super().__init__(f"{source}:{line}: {message}" if line else f"{source}: {message}")
        self.source, self.line = source, line


@dataclass(slots=True)
class SWFJob:
    """One job line; -1 = unknown (see the module doc for the fields)."""
    job: int
    submit: int
    wait: int
    run: int
    procs: int
    cpu_avg: float
    mem_used: float
    req_procs: int
    req_time: int
    req_mem: int
    status: int
    user: int
    group: int
    app: int
    queue: int
    partition: int
    prev_job: int
    think: int

    @property
    def size(self) -> int:
        """Processors the job needs: allocated, else requested, else -1."""
        return self.procs if self.procs > 0 else self.req_procs


FIELDS = tuple(f.name for f in fields(SWFJob))


@dataclass
class Trace:
    """A parsed SWF file: its header (label -> value; integer labels parsed,
    repeated labels such as ``Note`` as lists), free comments, the jobs."""
    jobs: list[SWFJob] = field(default_factory=list)
    header: dict = field(default_factory=dict)
    comments: list[str] = field(default_factory=list)

    @property
    def max_procs(self) -> int | None:
        return self.header.get("MaxProcs")


def _number(text: str, idx: int, source: str, lineno: int) -> int | float:
    try:
        if idx in _FLOAT_FIELDS and ("." in text or "e" in text.lower()):
            v: int | float = float(text)
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError
        else:
            v = int(text)
    except ValueError:
        kind = "a number" if idx in _FLOAT_FIELDS else "an integer"
        raise SWFError(source, lineno, f"field {idx + 1} ({FIELDS[idx]}) must be {kind}, "
                                        f"not {text[:40]!r}") from None
    if v < -1:
        raise SWFError(source, lineno, f"field {idx + 1} ({FIELDS[idx]}) is {text}: values are >= 0, "
                                        "or -1 for unknown")
    return v


def _header_line(text: str, trace: Trace, source: str, lineno: int) -> None:
    body = text[1:].strip()
    label, sep, value = body.partition(":")
    label, value = label.strip(), value.strip()
    if not sep or not label or " " in label:
        trace.comments.append(body)
        return
    if label in INT_LABELS:
        try:
            v = int(value)
        except ValueError:
            raise SWFError(source, lineno, f"header {label} must be an integer, not {value[:40]!r}") from None
        if v < 0 and label != "UnixStartTime":
            raise SWFError(source, lineno, f"header {label} must be >= 0, not {v}")
        trace.header[label] = v
    elif label in trace.header:
        old = trace.header[label]
        trace.header[label] = (old if isinstance(old, list) else [old]) + [value]
    else:
        trace.header[label] = value


def parse_swf(lines: str | Iterable[str], *, source: str = "<swf>", max_jobs: int = MAX_JOBS,
              max_line: int = MAX_LINE) -> Trace:
    """Parse SWF text (a string, or an iterable of lines). Raises :class:`SWFError`."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    trace = Trace()
    jobs = trace.jobs
    last_job, last_submit = 0, -1
    max_procs: int | None = None
    in_header = True
    for lineno, raw in enumerate(lines, 1):
        if len(raw) > max_line:
            raise SWFError(source, lineno, f"line longer than {max_line} characters")
        text = raw.strip()
        if not text:
            continue
        if text.startswith(";"):
            if in_header:
                _header_line(text, trace, source, lineno)
                max_procs = trace.header.get("MaxProcs")
            else:
                trace.comments.append(text[1:].strip())
            continue
        in_header = False
        if not text.isascii() or "_" in text:     # int() would take "1_000" and non-ASCII digits
            raise SWFError(source, lineno, "a job line holds ASCII numbers only")
        parts = text.split()
        if len(parts) != 18:
            raise SWFError(source, lineno, f"a job line has 18 fields, this one has {len(parts)}")
        v = [_number(p, i, source, lineno) for i, p in enumerate(parts)]
        job = SWFJob(*v)
        if job.job < 1:
            raise SWFError(source, lineno, f"job number {job.job}: numbers start at 1")
        if job.job <= last_job:
            raise SWFError(source, lineno, f"job number {job.job} after {last_job}: numbers must increase")
        if job.submit < 0:
            raise SWFError(source, lineno, f"job {job.job}: submit time unknown (-1)")
        if job.submit < last_submit:
            raise SWFError(source, lineno, f"job {job.job}: submit time {job.submit} before the previous "
                                            f"job's {last_submit} (lines are sorted by submit time)")
        if job.status not in _STATUSES:
            raise SWFError(source, lineno, f"job {job.job}: status {job.status} (0-5 or -1)")
        if max_procs is not None and max(job.procs, job.req_procs) > max_procs:
            raise SWFError(source, lineno, f"job {job.job}: {max(job.procs, job.req_procs)} processors, "
                                            f"more than the header's MaxProcs {max_procs}")
        if len(jobs) >= max_jobs:
            raise SWFError(source, lineno, f"more than {max_jobs} jobs (raise max_jobs to read more)")
        jobs.append(job)
        last_job, last_submit = job.job, job.submit
    return trace


def read_swf(path: str | os.PathLike, *, max_bytes: int = MAX_BYTES, max_jobs: int = MAX_JOBS) -> Trace:
    """Read an SWF file (plain text; compressed files must be unpacked first)."""
    source = os.fspath(path)
    size = os.stat(source).st_size
    if size > max_bytes:
        raise SWFError(source, 0, f"{size} bytes, more than the limit of {max_bytes} (raise max_bytes)")
    with open(source, "rb") as f:
        head = f.read(2)
        if head == b"\x1f\x8b":
            raise SWFError(source, 0, "gzip-compressed: unpack it first (gunzip)")
        f.seek(0)
        try:
            text = io.TextIOWrapper(f, encoding="utf-8", errors="strict", newline=None)
            return parse_swf(text, source=source, max_jobs=max_jobs)
        except UnicodeDecodeError as exc:
            raise SWFError(source, 0, f"not UTF-8/ASCII text ({exc.reason} at byte {exc.start})") from None


def _fmt(v: int | float) -> str:
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else f"{v:.2f}"
    return str(v)


def format_swf(trace: Trace) -> str:
    """SWF text: the header labels, the free comments, then the jobs."""
    out = []
    for label, value in trace.header.items():
        for v in (value if isinstance(value, list) else [value]):
            out.append(f"; {label}: {v}")
    out.extend(f"; {c}" if c else ";" for c in trace.comments)
    out.extend(" ".join(_fmt(getattr(job, n)) for n in FIELDS) for job in trace.jobs)
    return "\n".join(out) + "\n"


def write_swf(path: str | os.PathLike, trace: Trace) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(format_swf(trace))
