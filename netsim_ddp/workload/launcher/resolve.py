"""A scenario's workload as a run launches it, resolved before anything is built: a missing
script, profile or trace fails now, not in every rank minutes later."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.workload.contract.noise_draws import resolved_trace
from netsim_ddp.workload.launcher.launch import WorkloadError


def resolved_workload(scenario: Scenario, iterations: int | None = None) -> WorkloadConfig:
    """The scenario's workload with `iterations` (when given), its script found, and its
    profile and the noise's trace as absolute paths the ranks read (relative ones from the
    scenario file's folder). ValueError naming the file when the scenario has no workload."""
    workload = scenario.workload
    if workload is None:
        raise ValueError(f"{scenario.path or scenario.name}: workload: required to run training; "
                         "add a [workload] section (see README)")
    if iterations is not None:
        workload = workload.model_copy(update={"iterations": iterations})
    base = scenario.path.parent if scenario.path is not None else Path.cwd()
    if workload.command is not None:
        resolve_command(workload.command, base if scenario.path is not None else None)
    if workload.noise is not None and workload.noise.trace is not None:
        workload = workload.model_copy(update={"noise": resolved_trace(workload.noise, base)})
    if workload.profile is None or Path(workload.profile).is_absolute():
        return workload
    return workload.model_copy(update={"profile": str((base / workload.profile).resolve())})


def resolve_command(command: Sequence[str], base_dir: Path | None) -> list[str]:
    """A relative script path is taken from `base_dir` (the scenario file's folder) if the
    file is there, else from the working directory; `-m MODULE` stays as it is."""
    if command[0] == "-m":
        return list(command)
    script = Path(command[0])
    places = [script] if script.is_absolute() else [
        *([base_dir / script] if base_dir is not None else []), Path.cwd() / script]
    found = next((place for place in places if place.is_file()), None)
    if found is None:
        raise WorkloadError(f"workload.command: no script {command[0]!r}: looked for "
                            + " and ".join(str(place) for place in places))
    script = found
    return [str(script.resolve()), *command[1:]]
