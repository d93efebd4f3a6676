#!/usr/bin/env bash
# rollout.backend = "vllm" on a GPU machine, in one go: install the vllm extra (unless vLLM is there already),
# run the GPU tests (vLLM's, and the native decoder's on CUDA), then time vLLM against our decoder and HF
# `generate` on the tiny and small models (benchmarks/gpu_generate.py --vllm).
#
#   bash benchmarks/gpu_vllm.sh [RESULTS_DIR]        run from the repository root; default benchmarks/results
#
# Use a fresh virtual environment: vLLM pins its own CUDA build of torch and replaces the one installed.
# Writes RESULTS_DIR/gpu_vllm_tests.log and RESULTS_DIR/gpu_generate_vllm.json. Exit status: 2 without a GPU (it
# then installs nothing), 3 when vLLM cannot be installed or imported, else the tests'; the benchmark runs only
# after the tests pass.
set -uo pipefail
out=${1:-benchmarks/results}
py=${PYTHON:-python3}
# no GPU, no install: the vllm extra replaces torch with a CUDA build, which a CPU environment must not get
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no NVIDIA GPU here (nvidia-smi finds none): nothing installed, nothing run"
  exit 2
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c "import vllm" 2>/dev/null; then
  echo "installing the vllm extra: $py -m pip install -e '.[vllm,test]'"
  "$py" -m pip install -q -e '.[vllm,test]' || { echo "vLLM could not be installed (no network? no wheel here?)"; exit 3; }
fi
"$py" -c "import torch, vllm; print('vllm', vllm.__version__, '| torch', torch.__version__, '|',
torch.cuda.get_device_name())" || exit 3
"$py" -m pytest -m gpu -q -p no:cacheprovider tests/scale/test_vllm_engine.py tests/rollout/test_cuda.py 2>&1 \
  | tee "$out/gpu_vllm_tests.log"
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  echo "GPU tests failed (exit $status): no benchmark"
  exit "$status"
fi
"$py" benchmarks/gpu_generate.py --vllm --out "$out/gpu_generate_vllm.json"
