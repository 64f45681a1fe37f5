"""`netsim-ddp clean`: what killed runs and killed host agents left behind."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
from rich.markup import escape

from netsim_ddp.cli.app import (
    EXIT_FAILED,
    err,
    main,
    out,
)

if TYPE_CHECKING:  # the fabric is imported when a command runs, not at start-up
    from netsim_ddp.fabric.nic.cleanup import NicCleanup


@main.command()
@click.option("--dry-run", is_flag=True, help="Only list what would be removed; writes nothing.")
@click.option("--forget-nic", metavar="NIC",
              help="Drop the records of killed agents' NIC of this name without restoring it "
                   "(after you put the NIC right by hand); nothing else is cleaned.")
def clean(dry_run: bool, forget_nic: str | None) -> None:
    """Remove what killed runs left (namespaces, processes, lock files) and restore NICs of
    killed `host` agents; live runs and agents are spared. Exit 1 if a NIC is left changed."""
    from netsim_ddp.fabric.stale import clean_stale_runs

    if forget_nic is not None:
        if not _clean_nics(dry_run, forget_nic).nics:
            out.print(f"no record of a killed agent names {escape(forget_nic)}")
        return
    report = clean_stale_runs(dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for name in report.removed:
        out.print(f"{verb} namespace {name}")
    if report.killed_processes:
        out.print(f"{'would kill' if dry_run else 'killed'} {report.killed_processes} "
                  "leftover processes")
    for run_id in report.removed_locks:
        out.print(f"{verb} the lock file of dead run {run_id}")
    for run_id, pid in report.live_runs.items():
        out.print(f"left run {run_id} alone: it is live (pid {pid})")
    if report.root_litter:
        out.print(f"root's killed runs left {len(report.root_litter)} namespaces "
                  f"({', '.join(report.root_litter)}): run `sudo netsim-ddp clean` to remove them")
    nics = _clean_nics(dry_run)
    if not (report.removed or report.killed_processes or report.removed_locks or nics.nics
            or nics.orphan_locks):
        out.print("nothing to clean")
    if nics.left_changed:
        sys.exit(EXIT_FAILED)


def _clean_nics(dry_run: bool, forget: str | None = None) -> NicCleanup:
    """Say what cleaning up NICs (fabric.nic.cleanup) did, or would do."""
    from netsim_ddp.fabric.nic.cleanup import clean_nics

    cleanup = clean_nics(dry_run=dry_run, forget=forget)
    if cleanup.root_records:
        out.print(f"root's `host` agents recorded {cleanup.root_records} NICs: only root can "
                  "tell whether an agent was killed and restore its NIC (`sudo netsim-ddp "
                  "clean`)")
    for nic in cleanup.nics:
        where = f"{nic.ifname} (network namespace {nic.netns_inode}, agent pid {nic.pid})"
        line = {"restored": f"restored {where} as its agent recorded it"
                            + (f"; killed {nic.killed_processes} of its processes"
                               if nic.killed_processes else ""),
                "would-restore": f"would restore {where}",
                "gone": f"dropped the record of {where}: {nic.error}",
                "would-drop": f"would drop the record of {where}: {nic.error}",
                "forgotten": f"forgot the record of {where}; the NIC was not touched",
                "would-forget": f"would forget the record of {where}"}.get(nic.outcome)
        if line is not None:
            out.print(escape(line), soft_wrap=True)
        else:
            err.print(f"[red]could not restore {escape(where)}[/]: {escape(str(nic.error))}",
                      soft_wrap=True)
    if cleanup.orphan_locks:
        verb = "would remove" if dry_run else "removed"
        out.print(f"{verb} {len(cleanup.orphan_locks)} lock files of NIC records that are gone")
    return cleanup
