#!/usr/bin/env bash
# The real openpi-client in a venv of its own: it pins numpy<2, which the main venv's stack does not take.
#   scripts/install_openpi_client.sh [VENV_DIR]     (default .venv-openpi)
# The tests drive python -m wam_gym.serve with it (tests/clients/); make test builds it beside the main tests,
# and tests/conftest.py's openpi_python fixture runs this when it is missing.
set -euo pipefail
venv=${1:-.venv-openpi}
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check openpi-client==0.1.2 "numpy<2" typing_extensions
touch "$venv/.installed"
