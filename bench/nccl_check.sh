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
# already has netsim-ddp (skips step 1); NSD_OUT (default nccl-check/) for the results;
# NSD_VENV and NSD_SITE (default .venv-gpu/, .nsd-site/) for what step 1 makes;
# NSD_SETUP_ONLY=1 to stop after step 1 (says which Python it would use, and why).
# Exit status: 0 the run passed; 1 a STOP (the finding is printed) or the run failed;
# 2 the wheels are missing; 124 the run ran past its time (its JSON and logs are kept).
set -euo pipefail

cd "$(dirname "$0")/.."
WHEELS=${1:-wheels}
OUT=${NSD_OUT:-nccl-check}
VENV=${NSD_VENV:-.venv-gpu}
SITE=${NSD_SITE:-.nsd-site}
RUN_TIMEOUT=330    # the harness's own limit on the ranks: it then writes its JSON
HARD_TIMEOUT=390   # the backstop, should the harness itself hang
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
    # --system-site-packages gives the venv the *base* interpreter's packages: when python3 is
    # itself a venv (or torch sits in its user site), torch is not among them. So torch must
    # import in the new venv, or the plain folder is used instead.
    if "$python" -c 'import sys; sys.exit(sys.prefix != sys.base_prefix)' \
            && "$python" -m venv --system-site-packages "$VENV" 2>/dev/null \
            && "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
        PY=$VENV/bin/python
        target=()
        say "installing into $VENV/ (a venv that sees the host's torch)"
    else  # no venv/ensurepip, or a venv without the host's torch: a folder on PYTHONPATH
        rm -rf "$VENV"
        say "a venv here would not see $python's torch: installing into $SITE/ instead"
        PY=$python
        target=(--target "$SITE")
        case $SITE in /*) site_path=$SITE ;; *) site_path=$PWD/$SITE ;; esac
        export PYTHONPATH="$site_path${PYTHONPATH:+:$PYTHONPATH}"  # the ranks inherit it
    fi
    if [[ -n "${NSD_SETUP_ONLY:-}" ]]; then
        say "setup only: would use $PY ${target[*]}"
        exit 0
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
# --timeout: the harness kills hung ranks itself and still writes its JSON (with the error);
# the outer timeout (SIGTERM, then SIGKILL) only catches a harness that hangs.
timeout --signal=TERM --kill-after=30 "$HARD_TIMEOUT" "$PY" -m netsim_ddp.cli run "$SCENARIO" \
    --allow-untrusted --timeout "$RUN_TIMEOUT" --json "$OUT/run.json" --out "$OUT/run" \
    || status=$?
if [[ $status -eq 124 || $status -eq 137 ]]; then
    say "netsim-ddp run ran past ${HARD_TIMEOUT}s and was stopped"
    status=124
else
    say "netsim-ddp run exited $status"
fi
if [[ -f "$OUT/run.json" ]]; then
    "$PY" bench/nccl_summary.py "$OUT/run.json" || true
else
    # The run's own folder is $OUT/run/run-<id>/ (`latest` points at it); logs per launch.
    echo "no results written; the run's logs:" >&2
    found=0
    while IFS= read -r log; do
        found=1
        echo "--- $log" >&2
        tail -n 40 "$log" >&2
    done < <(find "$OUT/run/" -name '*.torchrun.log' 2>/dev/null | sort)
    [[ $found -eq 1 ]] || echo "(no rank logs under $OUT/run/: the run stopped before any launch)" >&2
fi
say "done (exit $status)"
exit "$status"
