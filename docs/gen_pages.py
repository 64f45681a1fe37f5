"""Pages generated at build time (mkdocs-gen-files), so they cannot drift from the code:

- index.md: the README (the front page), its links to docs/ made relative to the site;
- reference/scenario.md: every table and field of a scenario file, from the pydantic model's
  JSON Schema (the same one `netsim-ddp schema` prints).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import mkdocs_gen_files

from netsim_ddp.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent

# The TOML table each model is written as (the schema's $defs are named after the classes).
TABLES = {
    "Scenario": "top level", "Topology": "[topology]", "LinkConfig": "[link]",
    "TcpConfig": "[link.tcp]", "LinkOverride": "[[link.override]]",
    "LinkChange": "[[link.schedule]]",
    "BackgroundFlow": "[[background]]", "FidelityConfig": "[fidelity]",
    "WorkloadConfig": "[workload]", "Variant": "[[workload.variant]]",
    "ComputeNoise": "[workload.noise]", "Stalls": "[workload.noise.stalls]",
    "GpuSpeed": "[workload.noise.gpu_speed]", "SlowEpisode": "[[workload.noise.episode]]",
    "ComputeTrace": "[workload.noise.trace]", "SweepConfig": "[sweep]",
    "ProjectionConfig": "[sweep.projection]", "Expectation": "[[expect]]",
}


def front_page() -> str:
    text = (ROOT / "README.md").read_text()
    return re.sub(r"\]\(docs/", "](", text)


def _type(schema: dict) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{TABLES.get(name, name)}`](#{_anchor(name)})"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"] if s.get("type") != "null")
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema and schema["additionalProperties"]:
        return f"table of {_type(schema['additionalProperties'])}"
    return kind


def _bounds(schema: dict) -> str:
    parts = []
    for key, text in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                      ("exclusiveMaximum", "<"), ("minLength", "length >="),
                      ("maxLength", "length <="), ("minItems", "items >="),
                      ("maxItems", "items <=")):
        if key in schema:
            parts.append(f"{text} {schema[key]}")
    return ", ".join(parts)


def _anchor(name: str) -> str:
    return name.lower()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def scenario_reference() -> str:
    schema = Scenario.model_json_schema()
    defs = schema.get("$defs", {})
    # In the order a scenario file is written; a model not named in TABLES still gets a section.
    models = {"Scenario": schema, **{name: defs[name] for name in TABLES if name in defs},
              **{name: model for name, model in defs.items() if name not in TABLES}}
    out = ["# Scenario file reference", "",
           "Generated from the scenario model (`netsim-ddp schema` prints the same JSON Schema), "
           "so it always matches the code. Rates, sizes and durations are written as people write "
           "them (`\"10gbit\"`, `\"25MB\"`, `\"100us\"`); unknown keys are errors. A worked "
           "example: [Scenario files](../scenarios.md).", ""]
    for name, model in models.items():
        out += [f"## {TABLES.get(name, name)} {{#{_anchor(name)}}}", ""]
        if model.get("description"):
            out += [model["description"].strip().split("\n\n")[0], ""]  # the summary
        out += ["| field | type | default | bounds | description |", "|---|---|---|---|---|"]
        required = set(model.get("required", ()))
        for field, prop in model.get("properties", {}).items():
            default = ("required" if field in required
                       else f"`{json.dumps(prop['default'])}`" if "default" in prop else "")
            out.append(f"| `{field}` | {_cell(_type(prop))} | {_cell(default)} | "
                       f"{_cell(_bounds(prop))} | {_cell(prop.get('description', ''))} |")
        out.append("")
    return "\n".join(out)


with mkdocs_gen_files.open("index.md", "w") as page:
    page.write(front_page())
with mkdocs_gen_files.open("reference/scenario.md", "w") as page:
    page.write(scenario_reference())
