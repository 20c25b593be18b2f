#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install wam_gym with the given extras.
#   scripts/install.sh VENV_DIR EXTRAS        e.g. scripts/install.sh .venv metaworld,dev
# torch goes in first so pip never resolves it on its own: the CPU wheel 2.13.0 on a
# machine without an NVIDIA GPU, the default (CUDA) wheel on one that has it. A torch
# already in the venv (a GPU user's CUDA build, say) is left as it is.
set -euo pipefail
venv=${1:?usage: scripts/install.sh VENV_DIR EXTRAS}
extras=${2:-dev}
python=${PYTHON:-python3}
cd "$(dirname "$0")/.."

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "WARNING: Location" >&2); }

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[install] NVIDIA GPU found: installing the default (CUDA) torch build"
    pip install "torch>=2.4"
  else
    echo "[install] no NVIDIA GPU: installing the CPU build torch==2.13.0"
    pip install "torch==2.13.0"
  fi
fi
# DeepSpeed (train extra) would otherwise try to compile its CUDA/CPU ops at install time;
# they are built on first use instead.
export DS_BUILD_OPS=${DS_BUILD_OPS:-0}
echo "[install] wam_gym[$extras] into $venv"
pip install -e ".[$extras]"

# ManiSkill3 renders through Vulkan; Debian 12's lavapipe (Mesa 22.3) is too old for SAPIEN 3
# ("Failed to find a supported physical device"), bookworm-backports' Mesa 25 works.
if [[ ",$extras," == *",maniskill,"* ]] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
   && ! dpkg-query -W -f '${Version}' mesa-vulkan-drivers 2>/dev/null | grep -qE '^(2[5-9]|[3-9][0-9])'; then
  echo "[install] ManiSkill: Mesa 25 Vulkan (lavapipe) from bookworm-backports"
  echo 'deb http://deb.debian.org/debian bookworm-backports main' > /etc/apt/sources.list.d/bookworm-backports.list
  apt-get update -qq && apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers libvulkan1 >/dev/null
fi

# MuJoCo renders offscreen through EGL or OSMesa (Mesa). Install them where we may.
if ! ldconfig -p 2>/dev/null | grep -qE "libEGL.so|libOSMesa.so"; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[install] no EGL/OSMesa library: installing Mesa from Debian"
    apt-get update -qq && apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri libosmesa6 >/dev/null
  else
    echo "[install] WARNING: no EGL/OSMesa found; rendering needs: apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri libosmesa6" >&2
  fi
fi
