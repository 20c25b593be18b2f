#!/usr/bin/env bash
# Train with DeepSpeed ZeRO-1 (training/configs/zero1.json): optimizer states partitioned across ranks.
# Usage: [NPROC_PER_NODE=N] [MASTER_PORT=P] bash scripts/train_zero1.sh [HYDRA_OVERRIDE ...]  (--help for more)
set -euo pipefail
WAM_ZERO_NAME=zero1 exec bash "$(dirname "${BASH_SOURCE[0]}")/train_zero_common.sh" "$@"
