# Sourced by the GPU scripts (profile-gpu.sh, run-gpu.sh): puts a `python` on PATH that
# runs $RUBICK_PYTHON (default: python3, else python), and sets `py` to it. A script, not
# a link: a venv's python found through a link elsewhere loses its packages.
py="${RUBICK_PYTHON:-$(command -v python3 || command -v python)}"
shim="$(mktemp -d)"
printf '#!/bin/sh\nexec %q "$@"\n' "$py" >"$shim/python"
chmod +x "$shim/python"
export PATH="$shim:$PATH" PYTHONUNBUFFERED=1
