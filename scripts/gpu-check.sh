#!/usr/bin/env bash
# The GPU tier, run on a machine with an NVIDIA GPU and no network (see README). Today it checks
# that transformers (on that machine) loads the checkpoints keel writes with the same logits; the
# CUDA backend's suites join it when that backend exists. Carry .gpu-data (scripts/prepare-gpu-data.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
status=0
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
python3 scripts/hf_load_check.py .gpu-data 2>&1 | tee "$out/hf_load_check.log" || status=1
echo
echo "summary"
echo "  transformers loads keel's checkpoints: $(tail -n 1 "$out/hf_load_check.log")"
echo "  CUDA backend: not built (not written yet)"
exit $status
