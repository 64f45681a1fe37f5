"""The numbers the NCCL GPU check is for, from `netsim-ddp run --json` results:

    python bench/nccl_summary.py RESULTS.json

the transport NCCL chose between nodes, wire bytes per mode against fp32, the all-reduce
probe's bus bandwidth against the link, exposed comm per mode, and every check.
"""

from __future__ import annotations

import sys

from netsim_ddp.measure.document import ResultsDocument, ScenarioRecord, load_document


def summarize(document: ResultsDocument) -> list[str]:
    lines = []
    for entry in document.scenarios:
        lines.append(f"== {entry.name}: {entry.status}")
        if entry.placement:
            lines.append(f"placement: {entry.placement.summary}")
        for key in ("refused", "error"):
            if getattr(entry, key):
                lines.append(f"{key}: {getattr(entry, key)}")
        transport = entry.transport
        lines.append("transport: " + (transport.summary if transport
                                      else "not verified (not an NCCL run between nodes)"))
        for line in (transport.evidence if transport else [])[:4]:
            lines.append(f"  {line}")
        fidelity = entry.fidelity
        if fidelity:
            rate = _link_rate(entry)
            dtypes = ", ".join(f"{dtype} {bps / 1e9:.2f}" for dtype, bps in
                               (fidelity.dtype_bps[-1] if fidelity.dtype_bps else {}).items())
            lines.append(f"probe: busbw {fidelity.busbw_bps / 1e9:.2f} Gbit/s = "
                         f"{fidelity.busbw_bps / rate:.0%} of the {rate / 1e9:g} Gbit/s link, "
                         f"{fidelity.fraction:.0%} of its TCP goodput "
                         f"({'trusted' if fidelity.trusted else 'UNTRUSTED'}); "
                         f"per dtype, last attempt: {dtypes} Gbit/s")
        modes = entry.modes
        reference = modes["fp32"].wire_bytes_per_iteration if "fp32" in modes else None
        if modes:
            lines.append(f"{'mode':10} {'iter ms':>8} {'compute':>8} {'comm ms':>8} "
                         f"{'wire MB':>8} {'vs fp32':>8} {'busbw/link':>10}")
        for name, mode in modes.items():
            summary = mode.summary
            wire = mode.wire_bytes_per_iteration
            ratio = f"{wire / reference:.3f}" if reference else "-"
            busbw = (f"{mode.busbw_over_link:.2f}" if mode.busbw_over_link is not None
                     else "-")  # no collective timing: no figure
            lines.append(f"{name:10} {summary.iteration_s.median * 1e3:8.1f} "
                         f"{summary.compute_s.median * 1e3:8.1f} "
                         f"{summary.comm_s.median * 1e3:8.1f} {wire / 1e6:8.1f} "
                         f"{ratio:>8} {busbw:>10}")
        for check in entry.checks:
            lines.append(f"  {'ok' if check.passed else 'FAILED'} {check.name}: {check.detail}")
    return lines


def _link_rate(entry: ScenarioRecord) -> float:
    from netsim_ddp.scenario.units import parse_rate

    rate = (entry.scenario or {})["link"]["rate"]  # the scenario's own (validated) JSON
    return float(rate) if isinstance(rate, int | float) else parse_rate(rate)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print("\n".join(summarize(load_document(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
