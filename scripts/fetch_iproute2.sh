#!/usr/bin/env bash
# Download iproute2 (ip, tc) and the shared libraries it needs as .deb files into .debs/,
# so they can be copied to a machine without iproute2 and unpacked there by
# scripts/iproute2_env.sh (into /tmp, never over /). Needs apt (Debian/Ubuntu); no root needed
# for the download itself, root only if the package lists must be refreshed.
#
#   scripts/fetch_iproute2.sh [extra-package ...]
set -euo pipefail

PKGS=(iproute2 libbpf1 libmnl0 libxtables12 libelf1 libcap2 libtirpc3 libdb5.3
      libbsd0 libmd0 zlib1g)  # the last three: ip/tc link them too (ldd /usr/sbin/ip)
OUT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.debs"

command -v apt-get >/dev/null || { echo "fetch_iproute2: apt-get not found (Debian/Ubuntu only)" >&2; exit 1; }
mkdir -p "$OUT_DIR"
cd "$OUT_DIR"
if ! apt-get download "${PKGS[@]}" "$@" 2>/dev/null; then
    echo "fetch_iproute2: refreshing package lists (apt-get update)" >&2
    apt-get update -qq
    apt-get download "${PKGS[@]}" "$@"
fi
echo "fetch_iproute2: $(ls -1 "$OUT_DIR"/*.deb | wc -l) .deb files in $OUT_DIR:"
ls -1 "$OUT_DIR"/*.deb
