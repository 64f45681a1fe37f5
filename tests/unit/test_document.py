"""The result model: today's keys read and written, legacy documents, clear errors, the host."""

import json

import pytest

from netsim_ddp.measure.document import SCHEMA_VERSION, ResultsDocument, load_document, save
from netsim_ddp.measure.machine import MachineInfo, content_digest, machine_warning
from netsim_ddp.measure.record import DocumentError

SUMMARY = {"n": 2, "mean": 0.11, "median": 0.11, "std": 0.01, "p5": 0.1, "p95": 0.12,
           "iqr": 0.01, "min": 0.1, "max": 0.12}
MODE = {"iteration_s": [0.1, 0.12], "comm_s": [0.05, 0.06], "compute_s": [0.05, 0.06],
        "summary": {"iteration_s": SUMMARY, "comm_s": SUMMARY, "compute_s": SUMMARY},
        "scaling_efficiency": 0.5, "wire_bytes_per_iteration": 1e6,
        "a_key_a_newer_writer_added": [1, 2]}
LEGACY = {"netsim_ddp": "0.1.0", "sweeps": [],
          "scenarios": [{"name": "s", "status": "passed", "passed": True, "refused": None,
                         "modes": {"fp32": MODE},
                         "checks": [{"name": "c", "passed": True, "detail": "d",
                                     "p_value": None}]}]}


def test_a_document_without_version_is_legacy_and_keeps_every_key(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(LEGACY))
    document = load_document(path)
    assert document.version == 1 and document.created_at is None
    mode = document.scenarios[0].modes["fp32"]
    assert mode.summary.iteration_s.median == 0.11 and mode.summary.collective_s is None
    written = load_document(save(document, tmp_path / "again.json")).dump()
    entry = written["scenarios"][0]
    assert entry["modes"]["fp32"]["a_key_a_newer_writer_added"] == [1, 2]  # passed through
    assert "collective_s" not in entry["modes"]["fp32"]["summary"]  # absent stays absent
    assert "scenario_digest" not in entry and "machine_info" not in written
    assert entry["checks"] == LEGACY["scenarios"][0]["checks"]


def test_a_new_document_is_stamped_with_version_time_and_host():
    document = ResultsDocument.new("9.9", [], [])
    data = json.loads(document.to_json())
    assert data["version"] == SCHEMA_VERSION and data["netsim_ddp"] == "9.9"
    assert data["created_at"].endswith("+00:00")
    assert data["machine_info"]["node"] and data["machine_info"]["cpu"]["count"] >= 1


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d["scenarios"][0]["modes"]["fp32"].update(comm_s="fast"),
     "scenarios.0.modes.fp32.comm_s"),
    (lambda d: d["scenarios"][0]["modes"]["fp32"]["summary"].pop("comm_s"),
     "scenarios.0.modes.fp32"),  # a script's record has no comm_s: only its samples need one
    (lambda d: d["scenarios"][0].update(status="great"), "scenarios.0.status"),
    (lambda d: d.update(version=SCHEMA_VERSION + 1), "version"),
    (lambda d: d.update(created_at="yesterday"), "created_at"),
])
def test_a_malformed_document_names_the_file_and_the_field(tmp_path, change, field):
    data = json.loads(json.dumps(LEGACY))
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DocumentError, match=rf"^{path}: {field.replace('.', '[.]')}: "):
        load_document(path)


def test_the_digest_ignores_key_order_and_sees_every_value():
    assert content_digest({"a": 1, "b": [2]}) == content_digest({"b": [2], "a": 1})
    assert content_digest({"a": 1}) != content_digest({"a": 2})


def test_machine_warning_names_the_fields_that_differ():
    saved = MachineInfo.model_validate({"node": "ci-1", "release": "6.1", "cpu": {
        "brand_raw": "EPYC", "count": 2}, "torch_version": "2.12.0"})
    current = MachineInfo.model_validate({"node": "ci-2", "release": "6.8", "cpu": {
        "brand_raw": "EPYC", "count": 4}})  # torch unknown: not a difference
    warning = machine_warning(saved, current, "baseline b.json")
    assert warning is not None and warning.startswith("warning: baseline b.json")
    assert "release: '6.1' != '6.8'" in warning and "cpu.count: 2 != 4" in warning
    assert "node" not in warning and "torch" not in warning  # a hostname is not a kind
    assert machine_warning(saved, saved, "b") is None
    assert machine_warning(None, current, "b") is None
