"""The options of a session of runs, defined once for both front ends: `netsim-ddp run` and
`host` take each as --NAME, pytest as --netsim-NAME. Kept free of imports so that building the
CLI or registering the plugin's options loads nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

DEFAULT_ALPHA = 0.05
# `netsim-ddp host`: how long to wait for every host to arrive, and for a silent one's heartbeat
JOIN_TIMEOUT_S = 300.0
HEARTBEAT_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class SessionOption:
    """One option: --NAME on the command line, --netsim-NAME in pytest (its value in
    `config.getoption("netsim_NAME")`)."""

    name: str  # the flag, without dashes
    dest: str  # the CLI command's parameter
    help: str
    kind: Literal["path", "folder", "count", "fraction", "flag", "list"]
    metavar: str | None = None
    default: Any = None

    @property
    def pytest_flag(self) -> str:
        return f"--netsim-{self.name}"

    @property
    def pytest_dest(self) -> str:
        return "netsim_" + self.name.replace("-", "_")


SESSION_OPTIONS = {option.name: option for option in (
    SessionOption("baseline", "baseline", "Gate every scenario against this baseline file.",
                  "path", "PATH"),
    SessionOption("save-baseline", "save_baseline", "Save the results as a baseline "
                  "(pytest-benchmark's format).", "path", "PATH"),
    SessionOption("tolerance", "tolerances", "Allowed regression against the baseline, e.g. "
                  "median:10% or comm_s.p95:15% (repeatable; default median:10%).", "list",
                  "METRIC:PCT"),
    SessionOption("alpha", "alpha", "Significance level of verdicts and regressions.",
                  "fraction", default=DEFAULT_ALPHA),
    SessionOption("json", "json_out", "Write the results as JSON ('-': stdout, CLI only).",
                  "path", "OUT"),
    SessionOption("iterations", "iterations", "Override the measured iterations of every "
                  "scenario.", "count", "N"),
    SessionOption("out", "out_dir", "Keep rank logs, results and traces here (default: a "
                  "temporary folder, kept only when the run failed or erred; the results' "
                  "out_dir names it).", "folder", "DIR"),
    SessionOption("history", "history_dir", "Add each scenario's results to this folder of "
                  "earlier runs and judge them against it: change points, and history checks "
                  "that fail on a regression from the best earlier level (tolerances: "
                  "--tolerance, default 5% per metric).", "folder", "DIR"),
    SessionOption("allow-untrusted", "allow_untrusted", "Run scenarios this host cannot drive "
                  "faithfully (results marked untrusted; else refused, and pytest skips them).",
                  "flag", default=False),
)}
