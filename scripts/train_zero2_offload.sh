#!/usr/bin/env bash
# Train with DeepSpeed ZeRO-2 + optimizer offload to CPU (training/configs/zero2_offload.json, DeepSpeed CPU Adam).
# Usage: [NPROC_PER_NODE=N] [MASTER_PORT=P] bash scripts/train_zero2_offload.sh [HYDRA_OVERRIDE ...]  (--help for more)
set -euo pipefail
WAM_ZERO_NAME=zero2_offload exec bash "$(dirname "${BASH_SOURCE[0]}")/train_zero_common.sh" "$@"
