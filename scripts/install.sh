#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install wam_gym with the given extras.
#   scripts/install.sh VENV_DIR EXTRAS        e.g. scripts/install.sh .venv metaworld,dev
# torch goes in first so pip never resolves it on its own: the CPU wheel 2.13.0 on a
# machine without an NVIDIA GPU, the default (CUDA) wheel on one that has it. A torch
# already in the venv (a GPU user's CUDA build, say) is left as it is.
#   scripts/install.sh --backports-source [APT_DIR [OS_RELEASE]]
#                                             print the backports source line it would write, and exit
set -euo pipefail

# This machine's Debian backports source, derived from its own apt configuration (no mirror
# named here): the entry whose suite is the release's codename (VERSION_CODENAME in os-release)
# is the main archive, whichever mirror or snapshot it points at; the backports source is the
# same URI (and signed-by key) with suite CODENAME-backports. Reads APT_DIR/sources.list and
# APT_DIR/sources.list.d/*.list (one-line format) and *.sources (deb822); prints one line
# "deb [signed-by=KEY] URI CODENAME-backports main", or fails when no such entry is configured.
backports_source() {
  local apt_dir=${1:-/etc/apt} os_release=${2:-/etc/os-release} codename f
  local files=()
  codename=$(. "$os_release" 2>/dev/null && echo "${VERSION_CODENAME:-}") || codename=
  if [ -z "$codename" ]; then
    echo "[install] no VERSION_CODENAME in $os_release: cannot name the backports suite" >&2
    return 1
  fi
  [ -f "$apt_dir/sources.list" ] && files+=("$apt_dir/sources.list")
  for f in "$apt_dir"/sources.list.d/*; do  # in apt's order: by name, .list and .sources together
    case "$f" in *.list | *.sources) [ -f "$f" ] && files+=("$f") ;; esac
  done
  if [ ${#files[@]} -eq 0 ] || ! awk -v want="$codename" '
    function emit(uri, options) {
      if (found) return
      found = 1
      printf "deb %s%s %s-backports main\n", (options == "" ? "" : "[" options "] "), uri, want
    }
    function end_stanza(   n, i, s, u) {  # deb822: one stanza ends at a blank line or the end of a file
      if (tolower(enabled) != "no" && (" " types " ") ~ /[ \t]deb[ \t]/ && uris != "") {
        n = split(suites, s, /[ \t]+/)
        for (i = 1; i <= n; i++) if (s[i] == want) { split(uris, u, /[ \t]+/); emit(u[1], key ~ /^\// ? "signed-by=" key : "") }
      }
      types = uris = suites = enabled = key = field = ""
    }
    FNR == 1 { if (deb822) end_stanza(); deb822 = (FILENAME ~ /\.sources$/) }
    deb822 {
      if ($0 ~ /^[ \t]*$/) { end_stanza(); next }
      if ($0 ~ /^#/) next
      if ($0 ~ /^[ \t]/) { if (field == "signed-by") key = "(inline)"; next }  # a continuation line
      field = tolower($0); sub(/:.*/, "", field)
      value = $0; sub(/^[^:]*:[ \t]*/, "", value); sub(/[ \t]+$/, "", value)
      if (field == "types") types = value; else if (field == "uris") uris = value
      else if (field == "suites") suites = value; else if (field == "enabled") enabled = value
      else if (field == "signed-by") key = value
      next
    }
    {
      line = $0; sub(/#.*/, "", line); $0 = line
      if ($1 != "deb") next
      i = 2; options = ""
      if ($2 ~ /^\[/) {
        for (; i <= NF; i++) { options = options " " $i; if ($i ~ /\]$/) break }
        i++; gsub(/^ *\[ *| *\] *$/, "", options)
      }
      if ($(i + 1) == want) emit($i, options)
    }
    END { if (deb822) end_stanza(); exit !found }
  ' "${files[@]}"; then
    echo "[install] no apt source for Debian $codename in $apt_dir: cannot derive its backports source" >&2
    return 1
  fi
}

if [ "${1:-}" = "--backports-source" ]; then
  shift
  backports_source "$@"
  exit
fi

venv=${1:?usage: scripts/install.sh VENV_DIR EXTRAS}
extras=${2:-dev}
python=${PYTHON:-python3}
cd "$(dirname "$0")/.."

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "WARNING: Location" >&2); }
# --no-compile: pip would byte-compile every module of every package (torch's alone is minutes of CPU); Python
# compiles the ones a program imports, once, on first import.
install() { pip install --no-compile "$@"; }

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[install] NVIDIA GPU found: installing the default (CUDA) torch build"
    install "torch>=2.4"
  else
    echo "[install] no NVIDIA GPU: installing the CPU build torch==2.13.0"
    install "torch==2.13.0"
  fi
fi
# DeepSpeed (train extra) would otherwise try to compile its CUDA/CPU ops at install time;
# they are built on first use instead.
export DS_BUILD_OPS=${DS_BUILD_OPS:-0}
echo "[install] wam_gym[$extras] into $venv"
install -e ".[$extras]"

# ManiSkill3 renders through Vulkan; Debian 12's lavapipe (Mesa 22.3) is too old for SAPIEN 3
# ("Failed to find a supported physical device"), bookworm-backports' Mesa 25 works. The
# backports source comes from this machine's own Debian source (its mirror, its key).
if [[ ",$extras," == *",maniskill,"* ]] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
   && ! dpkg-query -W -f '${Version}' mesa-vulkan-drivers 2>/dev/null | grep -qE '^(2[5-9]|[3-9][0-9])'; then
  if source_line=$(backports_source); then
    suite=$(echo "$source_line" | awk '{print $(NF - 1)}')
    echo "[install] ManiSkill: Mesa 25 Vulkan (lavapipe) from $suite: $source_line"
    echo "$source_line" > "/etc/apt/sources.list.d/$suite.list"
    apt-get update -qq && apt-get install -y -qq -t "$suite" mesa-vulkan-drivers libvulkan1 >/dev/null
  else
    echo "[install] WARNING: ManiSkill needs Mesa 25 Vulkan (lavapipe); add your Debian backports source and" \
         "apt-get install -t <codename>-backports mesa-vulkan-drivers libvulkan1" >&2
  fi
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
