#!/usr/bin/env bash
# A Debian bookworm + Python 3.11 base image for machines that cannot pull python:3.11-slim-bookworm (no Docker Hub,
# only a Debian mirror): debootstrap a minbase root, add python3 and python3-venv, import it as an image.
#
#   docker/base.sh [IMAGE]      # default localhost/forge-base:bookworm; prints the image name
#
# Then build with --build-arg BASE_IMAGE=IMAGE (`make images` does this by itself when the pull fails).
# Needs root and debootstrap, and buildah (or ENGINE=docker to import it into a Docker engine). About 2 minutes,
# 128 MB.
# The image is only rebuilt when it does not exist yet; FORCE=1 rebuilds it.
set -euo pipefail
image="${1:-localhost/forge-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
engine="${ENGINE:-buildah}"
buildah=(buildah --storage-driver "$("$(dirname "$0")/storage-driver.sh")")
exists() {
    if [ "$engine" = docker ]; then docker image inspect "$image" >/dev/null 2>&1
    else "${buildah[@]}" inspect --type image "$image" >/dev/null 2>&1; fi
}

if [ -z "${FORCE:-}" ] && exists; then
    echo "$image"
    exit 0
fi
root=$(mktemp -d /tmp/forge-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base: debootstrap bookworm minbase from $mirror" >&2
# passwd for useradd; ca-certificates for pip's HTTPS; python3-venv brings ensurepip (pip inside a venv).
debootstrap --variant=minbase --include=passwd,ca-certificates,python3,python3-venv \
    bookworm "$root/rootfs" "$mirror" >&2
# Trim what an image never needs: package lists and caches, docs, man pages, locales other than C.
chroot "$root/rootfs" apt-get clean
rm -rf "$root/rootfs"/var/lib/apt/lists/* "$root/rootfs"/var/cache/apt/*.bin "$root/rootfs"/var/log/* \
    "$root/rootfs"/usr/share/doc/* "$root/rootfs"/usr/share/man/* "$root/rootfs"/usr/share/info/* \
    "$root/rootfs"/tmp/* "$root/rootfs"/dev/*
find "$root/rootfs"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
# The mirror apt uses inside the image (debootstrap wrote only the main suite).
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
    "$mirror" "$mirror" > "$root/rootfs/etc/apt/sources.list"
tar -C "$root/rootfs" --numeric-owner -cf "$root/base.tar" .
path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ "$engine" = docker ]; then
    docker import --change "ENV LANG=C.UTF-8" --change "ENV PATH=$path" --change 'CMD ["python3"]' \
        "$root/base.tar" "$image" >/dev/null
else
    ctr=$("${buildah[@]}" from scratch)
    "${buildah[@]}" add "$ctr" "$root/base.tar" / >/dev/null
    "${buildah[@]}" config --env LANG=C.UTF-8 --env PATH="$path" --cmd python3 \
        --label org.opencontainers.image.description="Debian bookworm minbase + python3 (docker/base.sh)" "$ctr"
    "${buildah[@]}" commit --rm --quiet "$ctr" "$image" >/dev/null
fi
echo "base: $image ($(du -sh "$root/base.tar" | cut -f1) uncompressed)" >&2
echo "$image"
