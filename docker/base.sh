#!/usr/bin/env bash
# Base images made without any image registry: Debian bookworm from debootstrap, imported
# into the local Docker engine. Needs root, debootstrap and a reachable Debian mirror.
#   spreeze-base:bookworm      python3, venv and CA certificates only: a bare machine
#   spreeze-base:bookworm-gl   the same plus libosmesa6 (MuJoCo's software offscreen GL: the
#                              evaluator's videos), g++ and python3-dev (torch.compile's compiled
#                              learner steps): the base of the CPU image, which then needs no apt
# Images that already exist are kept (delete them to rebuild), except a bookworm-gl made before
# it held the compiler. Usage: bash docker/base.sh
set -euo pipefail
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BARE=spreeze-base:bookworm
GL=spreeze-base:bookworm-gl
GL_PACKAGES=(libosmesa6 g++ python3-dev)

have() { docker image inspect "$1" >/dev/null 2>&1; }
complete_gl() { have "$GL" && docker run --rm "$GL" sh -c 'command -v g++ && ls /usr/include/python3*/Python.h' >/dev/null 2>&1; }
if have "$BARE" && complete_gl; then
    echo "base images present: $BARE $GL"
    exit 0
fi
root=$(mktemp -d /var/tmp/spreeze-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT

import_root() {  # tar the root file system (without apt's caches) into an image named $1
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
    tar -C "$root" -c . | docker import -c 'CMD ["/bin/bash"]' -c 'ENV LANG=C.UTF-8' - "$1" >/dev/null
    echo "imported $1"
}

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR" \
    >/dev/null
have "$BARE" || import_root "$BARE"
chroot "$root" apt-get update -qq
DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends "${GL_PACKAGES[@]}" \
    >/dev/null
import_root "$GL"
