#!/usr/bin/env bash
# The GPU check of the NCCL path, in one short run (under 8 minutes):
#   1. install netsim-ddp from carried wheels onto the host's own CUDA build of torch;
#   2. `netsim-ddp check`: stop with its finding if no emulated network can be built here,
#      or if the NCCL path cannot be used (no GPU, no NCCL);
#   3. run scenarios/nccl-shared-gpu.toml: 2 nodes at 10 Gbit/s sharing the one GPU through
#      distinct NCCL host ids, fp32 / amp / amp-fp16 / amp-bf16 under NCCL;
#   4. print the transport NCCL chose, wire bytes per mode against fp32, the all-reduce
#      probe's bus bandwidth against the link, and the exposed comm per mode.
#
# Prepare the wheels on a machine with network access, from the repository root (the GPU
# host may reach nothing; it has Python 3.12 and torch with CUDA and NCCL already):
#   pip download --python-version 3.12 --only-binary=:all: \
#       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux_2_28_x86_64 --platform any -d wheels/ \
#       "pyroute2>=0.9.7,<0.10" "pydantic>=2.6,<3" "click>=8.1" "rich>=13" numpy scipy
#   pip wheel --no-deps -w wheels/ .
# (wheels/ is git-ignored: never commit it.) matplotlib and ruptures are left out on purpose:
# only `netsim-ddp report` and `netsim-ddp history` need them.
#
# Usage, from the repository root on the GPU host:
#   bench/nccl_check.sh [WHEELS_DIR]           (default: wheels/)
# Environment: PYTHON (default python3) to install onto; NSD_PYTHON to use a Python that
# already has netsim-ddp (skips step 1); NSD_OUT (default nccl-check/) for the results.
set -euo pipefail

cd "$(dirname "$0")/.."
WHEELS=${1:-wheels}
OUT=${NSD_OUT:-nccl-check}
SCENARIO=scenarios/nccl-shared-gpu.toml
mkdir -p "$OUT"
start=$SECONDS
say() { printf '[nccl-check %3ds] %s\n' $((SECONDS - start)) "$*"; }

if [[ -n "${NSD_PYTHON:-}" ]]; then
    PY=$NSD_PYTHON
    say "using $PY as it is"
else
    # The venv sees the host's packages, so the host's CUDA torch satisfies netsim-ddp's
    # torch range and pip never tries to fetch one.
    python=${PYTHON:-python3}
    if ! host=$("$python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'); then
        echo "STOP: $python cannot import torch; this check runs on the host's own CUDA build of torch" >&2
        exit 1
    fi
    say "installing netsim-ddp from $WHEELS/ onto Python $host"
    project=$(ls "$WHEELS"/netsim_ddp-*.whl 2>/dev/null | tail -n 1 || true)
    if [[ -z "$project" ]]; then
        echo "no netsim_ddp wheel in $WHEELS/ (pip wheel --no-deps -w $WHEELS/ .); see the top of $0" >&2
        exit 2
    fi
    deps=("pyroute2>=0.9.7,<0.10" "pydantic>=2.6,<3" "click>=8.1" "rich>=13" numpy scipy)
    if "$python" -m venv --system-site-packages .venv-gpu 2>/dev/null; then
        PY=.venv-gpu/bin/python
        target=()
    else  # no venv/ensurepip on the host: a plain folder on PYTHONPATH (the ranks inherit it)
        say "python -m venv is unavailable here: installing into .nsd-site/ instead"
        PY=$python
        target=(--target .nsd-site)
        export PYTHONPATH="$PWD/.nsd-site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-deps "${target[@]}" "$project"
    # What the host has (torch, numpy...) satisfies these in a venv; the rest comes from wheels.
    # pip then notes that matplotlib and ruptures are missing: expected, only `netsim-ddp
    # report` and `history` need them.
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" "${target[@]}" "${deps[@]}"
fi

say "netsim-ddp check"
if ! "$PY" -m netsim_ddp.cli check --json "$OUT/check.json"; then
    say "STOP: this host cannot build an emulated network (the finding is above): no NCCL run"
    exit 1
fi
if ! "$PY" - "$OUT/check.json" <<'EOF'
import json, sys
found = json.load(open(sys.argv[1]))["gpus"]
if not found["nccl_path"]:
    sys.exit(f"STOP: the NCCL path cannot be used here: {found['missing']}")
print(f"GPUs {found['count']} ({', '.join(found['names'])}), NCCL {found['nccl']}, "
      f"torch {found['torch']}, CUDA {found['cuda']}")
EOF
then
    exit 1
fi

say "run $SCENARIO (probe, then 4 modes under NCCL)"
status=0
# --allow-untrusted: the probe's verdict is printed either way; the numbers are the point.
timeout --signal=TERM 390 "$PY" -m netsim_ddp.cli run "$SCENARIO" --allow-untrusted \
    --json "$OUT/run.json" --out "$OUT/run" || status=$?
say "netsim-ddp run exited $status"
if [[ -f "$OUT/run.json" ]]; then
    "$PY" bench/nccl_summary.py "$OUT/run.json"
else
    echo "no results written; the run's logs are under $OUT/run/" >&2
    tail -n 40 "$OUT"/run/train/logs/*.torchrun.log 2>/dev/null || true
fi
say "done"
exit "$status"
