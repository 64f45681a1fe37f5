"""bench/nccl_summary.py prints what the GPU check is for from a results document."""

import importlib.util
from pathlib import Path

from netsim_ddp.measure.document import parse_document

ROOT = Path(__file__).resolve().parents[2]


def load_summary():
    spec = importlib.util.spec_from_file_location("nccl_summary", ROOT / "bench/nccl_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mode(wire, comm):
    stats = {"median": comm}
    return {"wire_bytes_per_iteration": wire, "busbw_over_link": 0.9, "scaling_efficiency": 0.5,
            "iteration_s": [comm + 0.01], "comm_s": [comm], "compute_s": [0.01],
            "summary": {"iteration_s": {"median": comm + 0.01}, "comm_s": stats,
                        "compute_s": {"median": 0.01}}}


def test_transport_wire_ratio_probe_and_comm_are_printed():
    document = {"scenarios": [{
        "name": "nccl-shared-gpu", "status": "passed", "refused": None, "error": None,
        "placement": {"requested": "nccl", "backend": "nccl",
                      "summary": "backend nccl, 2 ranks on 1 GPUs, shared"},
        "transport": {"ok": True,
                      "summary": "NCCL 2.27.7 joined the 2 nodes via NET/Socket/0 on eth0",
                      "evidence": ["x NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via "
                                   "NET/Socket/0"]},
        "fidelity": {"busbw_bps": 9.0e9, "fraction": 0.95, "trusted": True,
                     "dtype_bps": [{"float32": 9.0e9, "bfloat16": 9.1e9}],
                     "size_bytes": 2**23, "world_size": 2, "attempts_bps": [9.0e9],
                     "expected_bps": 9.47e9, "min_fraction": 0.9, "reason": "fast enough"},
        "scenario": {"link": {"rate": "10000000000.0bit"}},
        "modes": {"fp32": mode(400e6, 0.17), "amp-bf16": mode(200e6, 0.09)},
        "checks": [{"name": "crossed:fp32", "passed": True, "detail": "1.00 x"}]}]}
    text = "\n".join(load_summary().summarize(parse_document(document)))
    assert "transport: NCCL 2.27.7 joined the 2 nodes via NET/Socket/0 on eth0" in text
    assert "busbw 9.00 Gbit/s = 90% of the 10 Gbit/s link" in text
    assert "amp-bf16" in text and "0.500" in text and "90.0" in text  # ratio, comm ms
    assert "ok crossed:fp32" in text
