#!/usr/bin/env bash
# Train with DeepSpeed ZeRO-2 (training/configs/zero2.json): optimizer states and gradients partitioned.
# Usage: [NPROC_PER_NODE=N] [MASTER_PORT=P] bash scripts/train_zero2.sh [HYDRA_OVERRIDE ...]  (--help for more)
set -euo pipefail
WAM_ZERO_NAME=zero2 exec bash "$(dirname "${BASH_SOURCE[0]}")/train_zero_common.sh" "$@"
