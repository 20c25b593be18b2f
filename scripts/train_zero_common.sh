#!/usr/bin/env bash
# The shared launcher behind scripts/train_zero{1,2,2_offload}.sh: torchrun -m training deepspeed=NAME.
set -euo pipefail

NAME="${WAM_ZERO_NAME:?run scripts/train_zero1.sh, train_zero2.sh or train_zero2_offload.sh}"
usage() {
  cat <<USAGE
Usage: [NPROC_PER_NODE=N] [MASTER_PORT=P] bash scripts/train_${NAME}.sh [HYDRA_OVERRIDE ...]

Launches: torchrun --nproc_per_node "\$NPROC_PER_NODE" -m training deepspeed=${NAME} [HYDRA_OVERRIDE ...]
  (DeepSpeed config: training/configs/${NAME}.json)

Environment:
  NPROC_PER_NODE  processes (GPUs) on this node (default 1)
  MASTER_PORT     rendezvous port; unset = torchrun --standalone picks a free one
  TORCHRUN        launcher command (default: .venv/bin/torchrun if present, else torchrun on PATH)

Example (EasyWAM on 8 GPUs):
  NPROC_PER_NODE=8 bash scripts/train_${NAME}.sh task=libero_easywam_mot_wan22 mixed_precision=bf16
USAGE
}

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NPROC_PER_NODE="${NPROC_PER_NODE:-1}"
if ! [[ "$NPROC_PER_NODE" =~ ^[1-9][0-9]*$ ]]; then
  echo "NPROC_PER_NODE must be a positive integer, got '$NPROC_PER_NODE'" >&2
  exit 2
fi
if [[ -n "${TORCHRUN:-}" ]]; then
  read -r -a launcher <<<"$TORCHRUN"
elif [[ -x "$ROOT/.venv/bin/torchrun" ]]; then
  launcher=("$ROOT/.venv/bin/torchrun")
else
  launcher=(torchrun)
fi
launch=(--nproc_per_node "$NPROC_PER_NODE")
if [[ -n "${MASTER_PORT:-}" ]]; then
  launch+=(--master_port "$MASTER_PORT")
else
  launch+=(--standalone)
fi

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "${launcher[@]}" "${launch[@]}" -m training "deepspeed=${NAME}" "$@"
