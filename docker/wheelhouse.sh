#!/usr/bin/env bash
# Fill docker/wheelhouse/ with every wheel the images install, so that `docker build` needs no
# package index (the Dockerfiles then run pip with --no-index). Run it with the Python of the
# images (3.11) on the same architecture. The folder is emptied first.
#   bash docker/wheelhouse.sh                                                   # CPU torch
#   TORCH_INDEX=https://download.pytorch.org/whl/cu126 bash docker/wheelhouse.sh   # CUDA torch
# TORCH_INDEX="" uses only pip's own configuration (an index or find-links already set up). By
# default torch's CPU index is asked first; when it does not answer within PROBE_S seconds it is
# left out (one line says so) rather than retried for every wheel. An index given in
# TORCH_INDEX that does not answer stops the script instead.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docker/wheelhouse
DEFAULT_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX=${TORCH_INDEX-$DEFAULT_INDEX}
PYTHON=${PYTHON:-python3}
PROBE_S=${PROBE_S:-10}  # an index that answers at all answers in well under a second

answers() {  # whether the simple index $1 serves torch's page within PROBE_S seconds
    "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))' \
        "${1%/}/torch/" "$PROBE_S" 2>/dev/null
}
if [ -n "$TORCH_INDEX" ] && ! answers "$TORCH_INDEX"; then
    if [ "$TORCH_INDEX" != "$DEFAULT_INDEX" ]; then
        echo "wheelhouse: TORCH_INDEX=$TORCH_INDEX does not answer within ${PROBE_S}s" >&2
        exit 1
    fi
    echo "wheelhouse: $TORCH_INDEX does not answer within ${PROBE_S}s: torch comes from pip's own configuration"
    TORCH_INDEX=""
fi
find "$out" -name '*.whl' -delete
extra=()
[ -n "$TORCH_INDEX" ] && extra=(--extra-index-url "$TORCH_INDEX")
# the project's dependencies as wheels (sdists are built here), plus what building it needs
"$PYTHON" -m pip wheel --quiet --wheel-dir "$out" "${extra[@]}" . "setuptools>=68" wheel
rm -f "$out"/spreeze-*.whl  # the image installs the project from its source
if [ -z "$TORCH_INDEX" ] && compgen -G "$out/nvidia_*.whl" >/dev/null; then
    echo "wheelhouse: torch came with its CUDA libraries (nvidia-* wheels, GBs): for a CPU image set TORCH_INDEX"
fi
echo "$(find "$out" -name '*.whl' | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out"
