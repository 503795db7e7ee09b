#!/usr/bin/env bash
# Create (or reuse) the Python virtual environment that runs the PyTorch
# reference workload (examples/pytorch/train.py) and print its path.
#
# stdout: exactly one line, the venv's absolute path.  Logs go to stderr.
#
# Location: $RUBICK_VENV if set, else /var/tmp/rubick-venv when /var/tmp is
# writable, else <repo>/.venv.
#
# Fast path: a venv that holds the marker file .rubick-ok and imports
# torch and numpy is reused as is (a couple of seconds).  Otherwise it is
# (re)built in place and the marker is written only after a successful
# install, so an install killed half-way is detected and redone next time.
# (A venv cannot simply be built elsewhere and moved: pip writes the venv's
# absolute path into the shebangs of bin/pip, bin/torchrun, ...)
#
# Options (environment):
#   RUBICK_VENV=DIR            venv location
#   RUBICK_PYTHON=python3.x    interpreter used to create the venv
#   RUBICK_PIP_ARGS="..."      extra arguments for pip install
set -euo pipefail

log() { printf 'python-env: %s\n' "$*" >&2; }

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ -n "${RUBICK_VENV:-}" ]]; then
    venv=$RUBICK_VENV
elif [[ -d /var/tmp && -w /var/tmp ]]; then
    venv=/var/tmp/rubick-venv
else
    venv=$repo_root/.venv
fi
# Absolute path, without requiring it to exist.
case $venv in
    /*) ;;
    *) venv=$PWD/$venv ;;
esac

marker=$venv/.rubick-ok
check='import torch, numpy, kubernetes_validate, pytest, transformers, accelerate, lightning, deepspeed, setuptools, ruff, mypy'

venv_ok() {
    [[ -f $marker && -x $venv/bin/python ]] &&
        "$venv/bin/python" -c "$check" >/dev/null 2>&1
}

# torchtitan (rubick.integrations.torchtitan, examples/torchtitan) in a layer of its own inside the
# venv, put on PYTHONPATH by whoever runs it: its dependencies (datasets < 4.8) would
# downgrade huggingface-hub under transformers. Installed without dependency
# resolution, so every package it imports is listed, pinned (found by importing
# torchtitan.train and its llama3 configurations in this venv).
titan=$venv/torchtitan-0.3.0
titan_packages=(torchtitan==0.3.0 tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 spmd_types==0.2.3
    torch_checkpointing==0.1.1 torchdata==0.11.0 tensorboard==2.21.0 protobuf==7.36.2 absl-py==2.5.1
    datasets==4.7.0 multiprocess==0.70.19 pandas==3.1.1 python-dateutil==4.0.0 tzdata==2026.6 dill==0.4.1
    xxhash==4.1.0 pyarrow==26.0.1 httpx==0.29.0 requests==2.34.2 urllib3==2.8.0 certifi==2026.10.19.post1
    charset_normalizer==3.5.3)
titan_ok() { [[ -f $titan/.rubick-ok ]]; }

install_titan() {
    titan_ok && return 0
    log "pip install --target $titan ${titan_packages[*]}"
    rm -rf "$titan"
    # shellcheck disable=SC2086 # RUBICK_PIP_ARGS is a list of words on purpose
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-deps ${RUBICK_PIP_ARGS:-} \
        --target "$titan" "${titan_packages[@]}" >&2
    if ! PYTHONPATH=$titan "$venv/bin/python" -c 'import torchtitan.train, torchtitan.models.llama3.config_registry' >&2; then
        log "error: torchtitan does not import from $titan"
        exit 1
    fi
    echo "torchtitan 0.3.0" >"$titan/.rubick-ok"
}

if venv_ok && titan_ok; then
    log "reusing $venv"
    printf '%s\n' "$venv"
    exit 0
fi

mkdir -p "$(dirname "$venv")"

# Serialise concurrent callers: the second one waits, then finds the venv ready.
lock=$venv.lock
exec 9>"$lock"
if command -v flock >/dev/null 2>&1; then
    log "waiting for lock $lock"
    flock 9
fi

if venv_ok; then
    install_titan
    log "reusing $venv (built by a concurrent call, or torchtitan added)"
    printf '%s\n' "$venv"
    exit 0
fi

python=${RUBICK_PYTHON:-python3}
if ! command -v "$python" >/dev/null 2>&1; then
    log "error: $python not found"
    exit 1
fi

# A venv with a python that runs and no marker is a half install: pip
# resumes it (installed packages are skipped).  One whose python is broken
# (moved, base interpreter gone) is removed and created again.
if [[ -d $venv && ! -f $marker ]]; then
    if ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
        log "removing broken venv $venv"
        rm -rf "$venv"
    else
        log "completing unfinished venv $venv"
    fi
fi

if [[ ! -x $venv/bin/python ]]; then
    if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            log "installing python3-venv with apt-get"
            apt-get update >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv >&2
        else
            log "error: '$python -m venv' is unavailable (install python3-venv)"
            exit 1
        fi
    fi
    log "creating venv $venv with $("$python" --version 2>&1)"
    "$python" -m venv "$venv" >&2
fi

rm -f "$marker"
# kubernetes-validate: the published Kubernetes schemas, to check rubick-run's manifests;
# pytest: the tests of the contract's Python package (python/); transformers and
# accelerate: its Hugging Face Trainer adapter and examples/hf-trainer (no model is
# downloaded: the example builds its GPT-2 configuration); lightning: its Lightning adapter;
# deepspeed: examples/deepspeed (its engine runs CPU workers where there is no GPU) with
# ninja, which builds DeepSpeed's CPU communication op the first time an engine starts;
# setuptools: `make test` builds python/ with it (offline, no build isolation) for its
# tests; ruff and mypy: `make lint` of python/.
packages=(torch numpy kubernetes-validate pytest transformers accelerate lightning deepspeed ninja setuptools ruff mypy)
log "pip install ${packages[*]} (the default torch wheel is ~3 GB; takes minutes)"
# shellcheck disable=SC2086 # RUBICK_PIP_ARGS is a list of words on purpose
"$venv/bin/python" -m pip install --disable-pip-version-check ${RUBICK_PIP_ARGS:-} \
    "${packages[@]}" >&2

if ! "$venv/bin/python" -c "$check" >&2; then
    log "error: '$check' fails in $venv after install"
    exit 1
fi
"$venv/bin/python" -c 'import torch; print(torch.__version__)' >"$marker"
install_titan
log "ready: $venv (torch $(cat "$marker"))"
printf '%s\n' "$venv"
