#!/usr/bin/env bash
# The containers/storage driver buildah uses here (build.sh, base.sh and tests/test_images.py all ask this script):
# $STORAGE_DRIVER when set; else overlay where the kernel mounts one over the storage's own file system (as root:
# native overlayfs, no fuse); else vfs (rootless, or a file system overlay cannot sit on).
# overlay stores each layer once and a container as a thin upper layer; vfs copies the whole root file system for
# every layer and every container (the train image: tens of GB, and minutes of copying per step).
# Images built with one driver are invisible to the other: switching rebuilds once.
set -euo pipefail
if [ -n "${STORAGE_DRIVER:-}" ]; then
    echo "$STORAGE_DRIVER"
    exit 0
fi
root="${CONTAINERS_STORAGE_ROOT:-/var/lib/containers/storage}"
if [ "$(id -u)" = 0 ] && grep -qw overlay /proc/filesystems 2>/dev/null && mkdir -p "$root" 2>/dev/null; then
    probe=$(mktemp -d "$root/.overlay-probe.XXXXXX")
    mkdir "$probe/lower" "$probe/upper" "$probe/work" "$probe/merged"
    if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
        "$probe/merged" 2>/dev/null; then
        umount "$probe/merged"
        rm -rf "$probe"
        echo overlay
        exit 0
    fi
    rm -rf "$probe"
fi
echo vfs
