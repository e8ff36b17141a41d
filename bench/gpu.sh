#!/usr/bin/env bash
# The GPU checks of the throughput suite, as one script (about 6-8 minutes on one GPU):
#   0. the compiled steps captured as CUDA graphs agree with the eager update
#      (tests/test_compiled.py, its cuda cases);
#   1. update frame rate of the learner on cuda (compiled steps replayed as CUDA graphs) vs
#      the same steps compiled in process, their eager update and a textbook loop on cuda
#      (TD3 256-256 at large batches, SAC at one; target: TD3 >= 10 M samples/s on an H200),
#      with several batches per sample request: one message, one pinned host-to-device copy
#      per request; then TD3 64-64 at batch 256, where kernel launches bound the update,
#      with CUDA graphs on and off (learner.cuda_graphs=false: compiled kernels only);
#   2. sampling-only throughput with one sampler process per core but one;
#   3. the whole system training with the fused learner on the GPU.
# Needs the CUDA build of torch (README.md, "GPU install"). Results: JSON files in $OUT (default
# ./gpu-results) and the tables on stdout.
#
#   bash bench/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
OUT=${OUT:-gpu-results}
CORES=$(nproc)
SAMPLERS=$(( CORES > 2 ? CORES - 1 : 1 ))
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c "import torch; assert torch.cuda.is_available(), 'this torch build has no CUDA'; print('torch', torch.__version__, torch.cuda.get_device_name())"

"$PY" -m pytest -q -p no:cacheprovider tests/test_compiled.py -k cuda
"$PY" -m spreeze.cli bench update --device cuda --algo td3 --batch-sizes 4096 16384 32768 --hidden 256 256 \
    --threads 4 --seconds 8 --fill 200000 --json "$OUT/update-td3.json" learner.batches_per_request=4
"$PY" -m spreeze.cli bench update --device cuda --algo sac --batch-sizes 16384 --hidden 256 256 \
    --threads 4 --seconds 8 --fill 200000 --json "$OUT/update-sac.json" learner.batches_per_request=4
for graphs in true false; do
  "$PY" -m spreeze.cli bench update --device cuda --algo td3 --batch-sizes 256 --hidden 64 64 --seconds 5 \
      --no-compile-times --fill 20000 --json "$OUT/update-td3-small-graphs-$graphs.json" \
      learner.cuda_graphs=$graphs
done
"$PY" -m spreeze.cli bench sampling --samplers "$SAMPLERS" --envs 4 --seconds 10 --json "$OUT/sampling.json"
"$PY" -m spreeze.cli bench e2e --seconds 30 --json "$OUT/e2e.json" \
    learner.actor_device=cuda learner.threads=4 learner.batch_size=4096 learner.batches_per_request=4 \
    "td3.hidden=[256,256]" sampler.num_samplers="$(( SAMPLERS > 2 ? SAMPLERS - 2 : 1 ))" replay.update_to_data=0.25
echo "results in $OUT"
