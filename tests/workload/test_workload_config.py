"""WorkloadConfig / RankSpec validation: typed errors naming the field, before anything runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from netsim_ddp.precision.modes import MODES
from netsim_ddp.scenario.workload import DEFAULT_BUCKET_BYTES, RankSpec, WorkloadConfig


def error_fields(excinfo: pytest.ExceptionInfo[ValidationError]) -> set[str]:
    return {".".join(map(str, error["loc"])) for error in excinfo.value.errors()}


def test_units_and_defaults() -> None:
    config = WorkloadConfig(params="30M", bucket_size="1MiB")
    assert config.params == 30_000_000
    assert config.bucket_size == 2**20
    assert WorkloadConfig(params=1000).bucket_size == DEFAULT_BUCKET_BYTES == 25 * 2**20
    assert config.modes == ["fp32", "amp", "amp-fp16"]
    assert config.backend == "auto"


@pytest.mark.parametrize("model", ["mlp", "transformer", "my_pkg.models:build", "m:f"])
def test_model_forms_accepted(model: str) -> None:
    assert WorkloadConfig(model=model, params=1000).model == model


@pytest.mark.parametrize("model", ["resnet", "pkg.mod", "pkg.mod:", ":f", "a b:c", "pkg:mod:f"])
def test_bad_model_string_names_the_field(model: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        WorkloadConfig(model=model, params=1000)
    assert error_fields(excinfo) == {"model"}
    assert "package.module:factory" in str(excinfo.value)


def test_unknown_mode_lists_the_valid_ones() -> None:
    with pytest.raises(ValidationError) as excinfo:
        WorkloadConfig(params=1000, modes=["fp32", "fp8"])
    assert error_fields(excinfo) == {"modes"}
    message = str(excinfo.value)
    assert "'fp8'" in message
    assert all(name in message for name in MODES)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"colour": "blue"}, "colour"),
        ({"modes": []}, "modes"),
        ({"modes": ["amp", "amp"]}, "modes"),
        ({"batch_size": 0}, "batch_size"),
        ({"iterations": 0}, "iterations"),
        ({"warmup": -1}, "warmup"),
        ({"grad_accumulation": 0}, "grad_accumulation"),
        ({"backend": "mpi"}, "backend"),
        ({"params": "30 parsecs"}, "params"),
        ({"bucket_size": "25Mbit"}, "bucket_size"),
    ],
)
def test_invalid_values_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        WorkloadConfig(**{"params": 1000, **changes})
    assert error_fields(excinfo) == {field}


def test_frozen() -> None:
    config = WorkloadConfig(params=1000)
    with pytest.raises(ValidationError):
        config.params = 5  # type: ignore[misc]


def test_json_schema_documents_every_field_and_accepts_unit_strings() -> None:
    schema = WorkloadConfig.model_json_schema()
    assert schema["additionalProperties"] is False
    assert all(prop.get("description") for prop in schema["properties"].values())
    assert {"type": "string"} in schema["properties"]["params"]["anyOf"]


def test_rank_spec_round_trips_and_checks_modes() -> None:
    spec = RankSpec(workload=WorkloadConfig(params="1M", modes=["fp32", "amp"]), modes=["amp"])
    assert RankSpec.model_validate_json(spec.model_dump_json()) == spec
    assert spec.selected_modes() == ["amp"]
    assert RankSpec(workload=spec.workload).selected_modes() == ["fp32", "amp"]
    with pytest.raises(ValidationError) as excinfo:
        RankSpec(workload=spec.workload, modes=["nope"])
    assert error_fields(excinfo) == {"modes"}


def test_config_does_not_import_torch() -> None:
    # Scenario loading and schema export must not pay for (or require) torch.
    code = "import sys, netsim_ddp.workload; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
