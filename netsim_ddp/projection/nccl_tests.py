"""Read nccl-tests output (all_reduce_perf and friends) as people paste it.

The text format, as nccl-tests prints it (src/util.cu, v2.19; older versions differ as noted):

    # nccl-tests version 2.19.6 nccl-headers=... nccl-library=...       (2.19+)
    # Collective test starting: all_reduce_perf                          (2.19+)
    # nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 ...
    # Using devices
    #  Rank  0 Group  0 Pid   1887 on   worker-1 device  0 [0x8d] NVIDIA H100 80GB HBM3
    #       size         count      type   redop    root     time   algbw   busbw #wrong  ...
               8             2     float     sum      -1    42.56    0.00    0.00      0  ...
    # Avg bus bandwidth    : 92.3405

Older versions have no `Group`, no `root` column and an `error` column instead of `#wrong`;
some have no `redop`. What pasting adds, and this reader removes: Open MPI's `[1,0]<stdout>:`
and `[0]` tags (even mid-line, where two writes interleave), srun's `0: ` labels, Markdown's
quote marks and back-ticks, `#` eaten by a Markdown renderer, NCCL INFO/WARN lines, shell
prompts and command lines. The column header line decides where each number is, so every
variant of the table reads the same way. nccl-tests 2.19+ also writes JSON (`-J file.json`);
`parse_file` reads that too. nccl-tests has no CSV output.

A file may hold several runs (one per `# nThread` header). Each run must name its ranks (the
world size and hosts come from them) and have result rows; otherwise `NcclParseError` says,
in one line, what is missing and how to get it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "alltoall",
               "sendrecv", "gather", "scatter", "hypercube")
CALIBRATABLE = ("all_reduce", "reduce_scatter", "all_gather")
TYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8,
              "uint64": 8, "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4,
              "double": 8, "float64": 8, "f8e4m3": 1, "f8e5m2": 1}

_TAGS = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:|\[\d+\]")  # Open MPI --tag-output, [rank]
_SRUN_LABEL = re.compile(r"^\s*\d+:\s")
_NCCL_LOG = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|ABORT)\b|^NCCL version ")
_HEADER = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_STARTING = re.compile(r"Collective test starting:\s*(\S+)")
_RANK = re.compile(r"^Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+"
                   r"device\s+(-?\d+)\s+\[([^\]]*)\]\s*(.*)$")
_PROGRAM = re.compile(r"\b(" + "|".join(COLLECTIVES) + r")_perf")
_END = re.compile(r"Out of bounds values|Avg bus bandwidth|Collective test concluded")
_TIME_COLUMNS = ("time", "cputime")


class NcclParseError(ValueError):
    """The text is not (complete) nccl-tests output; the message is one line: where and why."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    host: str
    device: int
    device_name: str


@dataclass(frozen=True)
class Row:
    size: int  # bytes, as nccl-tests prints it (all_gather/reduce_scatter: the whole buffer)
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out_of_place_us: float | None
    in_place_us: float | None
    busbw_gbs: float | None  # as printed, in-place where there is one
    # nccl-tests' check of the result `time_s` comes from: values that were wrong (None where
    # the output has no `#wrong` column, as old versions' `error` column)
    wrong: int | None = None
    line: int = field(default=0, compare=False)  # in its file, 1-based (0: JSON)

    @property
    def time_s(self) -> float:
        """In place where measured (DDP all-reduces its buckets in place), else out of place."""
        value = self.in_place_us if self.in_place_us is not None else self.out_of_place_us
        assert value is not None  # a row without a time is rejected by the parser
        return value * 1e-6


@dataclass
class NcclTestRun:
    source: str
    line: int  # where the run starts in its file (1-based)
    collective: str | None = None
    ranks: list[RankInfo] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    n_threads: int | None = None
    n_gpus: int | None = None
    headers: int = 0  # `# nThread` lines seen; 2+ before any row = processes not in one job
    complete: bool = False  # the footer (Avg bus bandwidth) was seen

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(rank.host for rank in self.ranks))

    @property
    def gpus_per_host(self) -> int:
        return max(1, round(self.world_size / max(1, len(self.hosts))))

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"

    def as_dict(self) -> dict[str, object]:
        return {"source": self.source, "line": self.line, "collective": self.collective,
                "world_size": self.world_size, "hosts": self.hosts,
                "gpus_per_host": self.gpus_per_host,
                "devices": sorted({rank.device_name for rank in self.ranks}),
                "sizes": len(self.rows), "complete": self.complete}


def clean_line(raw: str) -> str:
    """One pasted line without the tags and marks that pasting adds."""
    line = _TAGS.sub("", raw.replace("\r", ""))
    line = _SRUN_LABEL.sub("", line, count=1)
    return line.strip().lstrip(">`").strip().rstrip("`")


def parse_text(text: str, source: str = "<text>") -> list[NcclTestRun]:
    """Every run in `text`, checked (see the module doc)."""
    runs: list[NcclTestRun] = []
    current: NcclTestRun | None = None
    columns: list[str] | None = None
    pending_collective: str | None = None
    programs: list[str] = []  # `X_perf` seen on command lines since the last run
    for number, raw in enumerate(text.splitlines(), start=1):
        line = clean_line(raw)
        if not line or _NCCL_LOG.search(line):
            continue
        content = line.lstrip("#").strip()
        if match := _STARTING.search(content):
            pending_collective = _collective_name(match.group(1))
            continue
        header = _HEADER.search(content)
        if header or content == "Using devices":
            # A run starts at its header line; a paste that begins later, at `Using devices`.
            if current is None or current.rows or current.complete:
                current = NcclTestRun(source, number, pending_collective or _last(programs))
                runs.append(current)
                columns, pending_collective, programs = None, None, []
            if header:
                current.headers += 1
                current.n_threads, current.n_gpus = int(header.group(1)), int(header.group(2))
            continue
        if match := _RANK.match(content):
            if current is None:
                raise NcclParseError(f"{source}:{number}: a rank line before the '# nThread ...' "
                                     "and '# Using devices' lines: paste the output from its "
                                     "first line")
            current.ranks.append(RankInfo(int(match.group(1)), match.group(4),
                                          int(match.group(5)), match.group(7).strip()))
            continue
        tokens = content.split()
        if tokens[:2] == ["size", "count"]:
            columns = tokens
            continue
        if _END.search(content):
            if current is not None and current.rows:
                current.complete = True
            continue
        if tokens and tokens[0].isdigit() and len(tokens) >= 4 and not content.startswith("("):
            if current is None or columns is None:
                raise NcclParseError(
                    f"{source}:{number}: a result row before the header and column lines: "
                    "paste the output from its first line ('# nThread ...')")
            current.rows.append(_row(tokens, columns, source, number))
            continue
        programs += _PROGRAM.findall(line)
    if not runs:
        raise NcclParseError(f"{source}: no nccl-tests output found (no '# nThread ... nGpus ...' "
                             "header line)")
    for run in runs:
        check_run(run)
    return runs


def parse_json(document: dict, source: str) -> list[NcclTestRun]:
    """nccl-tests' own JSON (`-J out.json`, nccl-tests 2.19+)."""
    try:
        config = document["config"]
        program = Path(str(document.get("args", [""])[0])).name
        run = NcclTestRun(source, 1, _collective_name(program) if program else None,
                          n_threads=config.get("nthreads"), n_gpus=config.get("ngpus"),
                          headers=1, complete="average_bus_bandwidth" in document)
        run.ranks = [RankInfo(int(d["rank"]), str(d["hostname"]), int(d["device"]),
                              str(d.get("device_info", ""))) for d in config["devices"]]
        for result in document["results"]:
            out, inplace = result.get("out_of_place"), result.get("in_place")
            run.rows.append(Row(
                int(result["size"]), int(result["count"]), str(result["type"]),
                result.get("redop"), int(str(result.get("root", "-1")).strip()),
                _json_time(out), _json_time(inplace),
                (inplace or out or {}).get("bus_bw"), _json_wrong(out, inplace)))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise NcclParseError(f"{source}: not nccl-tests JSON output (missing or bad {exc})") \
            from None
    check_run(run)
    return [run]


def _json_wrong(out: dict | None, inplace: dict | None) -> int | None:
    used = inplace if _json_time(inplace) is not None else out
    value = (used or {}).get("nwrong")
    return None if value is None else int(value)


def parse_file(path: str | Path) -> list[NcclTestRun]:
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise NcclParseError(f"{path}: cannot read: {exc.strerror}") from None
    if text.lstrip().startswith("{"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise NcclParseError(f"{path}: looks like JSON but is not: {exc}") from None
        return parse_json(document, str(path))
    return parse_text(text, str(path))


def check_run(run: NcclTestRun) -> None:
    """Raise NcclParseError unless the run names its ranks, once each, and has result rows of
    a known collective, each size once."""
    where = run.where
    if run.headers > 1 and not run.rows or len({r.rank for r in run.ranks}) < len(run.ranks):
        raise NcclParseError(
            f"{where}: {run.headers} processes each printed their own header and rank 0: they "
            "ran as separate jobs, not one (nccl-tests built without MPI=1; rebuild with "
            "`make MPI=1` and launch with mpirun/srun)")
    if not run.rows:
        raise NcclParseError(f"{where}: no result rows: the run did not finish or the paste "
                             "stops before the table")
    if not run.ranks:
        raise NcclParseError(f"{where}: no rank lines ('#  Rank  0 ... on HOST device ...'): "
                             "the paste starts after them; the world size and hosts come from "
                             "them, so paste the output from its first line")
    sizes = [row.size for row in run.rows]
    repeated = sorted({s for s in sizes if sizes.count(s) > 1})
    if repeated:
        raise NcclParseError(f"{where}: size {repeated[0]} appears {sizes.count(repeated[0])} "
                             "times in one run: outputs of separate jobs interleaved (nccl-tests "
                             "built without MPI=1?); paste one run")
    if run.collective is None:
        run.collective = _infer_collective(run)
    if run.collective is None:
        raise NcclParseError(f"{where}: cannot tell which collective this is (no 'Collective "
                             "test starting' line, no X_perf command line); name it with "
                             "--collective")


def _row(tokens: list[str], columns: list[str], source: str, number: int) -> Row:
    if len(tokens) < len(columns) - 1:  # a trailing timestamp column may be empty
        raise NcclParseError(f"{source}:{number}: a result row with {len(tokens)} fields where "
                             f"the column header names {len(columns)}: a truncated paste?")
    times = [i for i, name in enumerate(columns) if name in _TIME_COLUMNS]
    if not times:
        raise NcclParseError(f"{source}:{number}: the column header has no 'time' column")
    named = dict(zip(columns[:times[0]], tokens, strict=False))
    try:
        size, count = int(named["size"]), int(named["count"])
        root = int(named["root"]) if "root" in named else None
        values = [_number(tokens[i]) if i < len(tokens) else None for i in times[:2]]
        busbw = [_number(tokens[i + 2]) if i + 2 < len(tokens) else None for i in times[:2]]
        wrong = [_count(tokens[i + 3]) if i + 3 < len(tokens) and i + 3 < len(columns)
                 and columns[i + 3] == "#wrong" else None for i in times[:2]]
    except (KeyError, ValueError) as exc:
        raise NcclParseError(f"{source}:{number}: cannot read this result row ({exc})") from None
    out_of_place = values[0]
    in_place = values[1] if len(values) > 1 else None
    if out_of_place is None and in_place is None:
        raise NcclParseError(f"{source}:{number}: a result row without a time")
    used = -1 if in_place is not None else 0
    return Row(size, count, named.get("type", "?"), named.get("redop"), root, out_of_place,
               in_place, busbw[-1] if busbw[-1] is not None else busbw[0], wrong[used], number)


def _count(token: str) -> int | None:
    return None if token.upper() == "N/A" else int(token)


def _number(token: str) -> float | None:
    if token.upper() == "N/A":
        return None
    value = float(token)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"bad number {token!r}")
    return value


def _json_time(group: dict | None) -> float | None:
    if not group:
        return None
    value = group.get("time", group.get("cpu_time"))
    return float(value) if value is not None else None


def _collective_name(program: str) -> str | None:
    name = Path(program).name
    for suffix in ("_mpi", "_perf"):
        name = name.removesuffix(suffix)
    return name if name in COLLECTIVES else None


def _last(programs: list[str]) -> str | None:
    return programs[-1] if programs and len(set(programs)) == 1 else None


def _infer_collective(run: NcclTestRun) -> str | None:
    """From the table alone: all_reduce prints size = count x type size; reduce_scatter and
    all_gather print the whole buffer, n x count x type size (redop `none` for all_gather)."""
    row = max(run.rows, key=lambda r: r.size)
    width = TYPE_BYTES.get(row.dtype)
    if width is None or row.count == 0:
        return None
    reduces = row.redop not in (None, "none")
    if row.size == row.count * width and reduces and row.root in (None, -1):
        return "all_reduce"
    if run.world_size > 1 and row.size == run.world_size * row.count * width and row.redop:
        return "all_gather" if row.redop == "none" else "reduce_scatter"
    return None
