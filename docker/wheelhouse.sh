#!/usr/bin/env bash
# Fill docker/wheelhouse/ with every wheel the images install, so that `docker build` needs no
# package index (the Dockerfiles then run pip with --no-index). Run it with the Python of the
# images (3.11) on the same architecture. The folder is emptied first.
#   bash docker/wheelhouse.sh                                                   # CPU torch
#   TORCH_INDEX=https://download.pytorch.org/whl/cu126 bash docker/wheelhouse.sh   # CUDA torch
# TORCH_INDEX="" uses only pip's own configuration (an index or find-links already set up).
set -euo pipefail
cd "$(dirname "$0")/.."
out=docker/wheelhouse
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
PYTHON=${PYTHON:-python3}
find "$out" -name '*.whl' -delete
extra=()
[ -n "$TORCH_INDEX" ] && extra=(--extra-index-url "$TORCH_INDEX")
# the project's dependencies as wheels (sdists are built here), plus what building it needs
"$PYTHON" -m pip wheel --quiet --wheel-dir "$out" "${extra[@]}" . "setuptools>=68" wheel
rm -f "$out"/spreeze-*.whl  # the image installs the project from its source
echo "$(find "$out" -name '*.whl' | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out"
