"""The base of every results record (measure/document.py): strict types, unknown keys kept."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)


def _current_status(value: Any) -> Any:
    """Documents written before the four outcomes said "refused" for a probe's refusal."""
    return "untrusted" if value == "refused" else value


# The outcomes of a run (docs/verdicts.md): "passed"; "failed", a check about the code under
# test failed; "untrusted", this host could not emulate the scenario faithfully (a probe that
# refused the host is one kind); "error", the run broke before it could be judged (a failure).
Status = Annotated[Literal["passed", "failed", "untrusted", "error"],
                   BeforeValidator(_current_status)]
# What a check is about: the code under test ("code": claims, wire bytes, baseline, history, a
# script's checks) or this host's emulation of the scenario ("host": the probe, the delay line,
# replay lateness, TCP clocks, background flows, link changes...). A failed "host" check makes a
# run untrusted, never failed.
CheckKind = Literal["code", "host"]


# Measured samples and their summaries: a NaN or infinity there is a broken measurement.
Finite = Annotated[float, Field(allow_inf_nan=False)]


class DocumentError(ValueError):
    """A results document that cannot be used; the message names the file and the field."""


class Record(BaseModel):
    """Every record: strict types (a string is never read as a number), unknown keys kept
    (a newer writer's additions survive a load and save), and keys listed in `_omit_none`
    left out rather than written as null (they were absent in the JSON before the model)."""

    model_config = ConfigDict(strict=True, extra="allow", ser_json_inf_nan="constants")
    _omit_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for key in self._omit_none:
            if data.get(key, 0) is None:
                del data[key]
        return data

    def dump(self) -> dict[str, Any]:
        """JSON-ready: what the document's file holds for this record."""
        return self.model_dump(mode="json")
