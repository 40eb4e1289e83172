#!/usr/bin/env bash
# Builds the VM lab's guest image from Debian packages and prints the
# directory holding it (last line of stdout):
#   vmlinuz         Debian's bookworm-backports 6.12 kernel (has nbd, ublk_drv,
#                   bcache, dm-cache, dm-cache-smq as modules); with
#                   VMLAB_KERNEL=6.17, trixie-backports' 6.17 kernel instead
#                   (ublk zero copy and automatic buffer registration, which
#                   6.12 lacks; the same user space)
#   rootfs.cpio     uncompressed initramfs: a debootstrap minbase Debian 12 with
#                   fio, lvm2, bcache-tools, nbd-client, ... and the kernel's
#                   modules trimmed to what the lab uses
#   kernel-release  the kernel's `uname -r`
#   libs.txt        shared libraries present in the image (run.sh copies a
#                   binary's other libraries in with it)
#
# The image is cached under $VMLAB_CACHE_DIR (default
# /var/cache/tiercache-vmlab), keyed by a hash of this script: editing it
# rebuilds the image, anything else reuses it. Downloaded .debs are kept
# there too. Building needs root; using a cached image does not.
# The host's apt sources are not changed: the backports kernel is fetched
# with a private sources list. The Debian mirror is the one the host's apt
# uses for its own release (override with VMLAB_MIRROR=URL).
#
# Usage: vmlab/build-image.sh [--force]
set -euo pipefail

SUITE=bookworm
# The guest kernel: Debian's backports build of this series.
KERNEL="${VMLAB_KERNEL:-6.12}"
case "$KERNEL" in
  6.12) KERNEL_SUITE=bookworm KERNEL_PATTERN='^linux-image-6\.12\.[0-9.]+\+deb12-amd64-unsigned$' ;;
  6.17 | 6.18) KERNEL_SUITE=trixie KERNEL_PATTERN="^linux-image-${KERNEL//./\\.}\\.[0-9.]+\\+deb13-amd64\$" ;;
  *) echo "vmlab-build: error: VMLAB_KERNEL=$KERNEL: 6.12, 6.17 or 6.18" >&2; exit 1 ;;
esac
# Packages inside the guest. fio/lvm2/bcache-tools/nbd-client/thin-provisioning-tools
# for the tests and the bcache/lvmcache comparison; libfontconfig1 because the
# tiercache binary links it (plots).
GUEST_PACKAGES=(kmod e2fsprogs util-linux procps psmisc fio lvm2 thin-provisioning-tools
  bcache-tools nbd-client libfontconfig1 strace xxd)
# Module directories kept (relative to lib/modules/VERSION/kernel).
MODULE_DIRS=(drivers/md drivers/block drivers/virtio drivers/char/hw_random fs/ext4 fs/jbd2
  fs/9p fs/netfs fs/fscache fs/mbcache.ko fs/mbcache.ko.xz net/9p lib crypto arch/x86/crypto)

here="$(cd "$(dirname "$0")" && pwd)"
force=0
[ "${1:-}" = "--force" ] && force=1

log() { echo "vmlab-build: $*" >&2; }
die() { echo "vmlab-build: error: $*" >&2; exit 1; }

if [ -n "${VMLAB_CACHE_DIR:-}" ]; then
  cache="$VMLAB_CACHE_DIR"
else
  cache=/var/cache/tiercache-vmlab
fi
recipe_hash="$({ cat "$here/build-image.sh"; echo "kernel $KERNEL"; } | sha256sum | cut -c1-16)"
image="$cache/image-$recipe_hash"
if [ "$force" -eq 0 ] && [ -f "$image/done" ]; then
  log "cached image $image"
  touch "$image/last-used" 2>/dev/null || true
  echo "$image"
  exit 0
fi
[ "$(id -u)" -eq 0 ] && mkdir -p "$cache"

# One builder at a time; others wait, then find the image built.
exec 9>"$cache/.lock" || die "cannot lock $cache/.lock (building the image needs root: sudo $0)"
flock 9
if [ "$force" -eq 0 ] && [ -f "$image/done" ]; then
  log "cached image $image (built while waiting)"
  echo "$image"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  die "building the image needs root (debootstrap, device nodes in the initramfs); run: sudo $0"
fi
for tool in debootstrap cpio apt-get dpkg-deb xz zstd; do
  command -v "$tool" >/dev/null || die "$tool missing: run scripts/install-vmlab-deps.sh"
done

# The mirror the host's apt uses for $SUITE main (deb822 .sources or one-line lists).
find_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '
      /^[[:space:]]*$/ { if (uri != "" && ok) { print uri; exit } uri = ""; ok = 0; next }
      tolower($1) == "uris:" { uri = $2 }
      tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
      END { if (uri != "" && ok) print uri }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '$1 == "deb" { u = ($2 ~ /^\[/) ? $3 : $2; s = ($2 ~ /^\[/) ? $4 : $3; if (s == suite) print u }' "$f"
  done
}
mirror="${VMLAB_MIRROR:-$(find_mirror | grep -v security | head -n1)}"
[ -n "$mirror" ] || die "no Debian $SUITE mirror found in the host's apt sources; set VMLAB_MIRROR=URL"
log "mirror $mirror"

started=$(date +%s)
work="$cache/build.$$"
rm -rf "$work" "$cache"/build.*
mkdir -p "$work" "$cache/debs"
trap 'rm -rf "$work"' EXIT

# 1. The kernel from backports, through a private apt configuration.
apt_dir="$work/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
echo "deb $mirror $KERNEL_SUITE-backports main" >"$apt_dir/sources.list"
apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
  -o "APT::Get::List-Cleanup=0" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
log "fetching the $KERNEL_SUITE-backports package list"
apt-get "${apt_opts[@]}" -qq update
kernel_pkg="$(apt-cache "${apt_opts[@]}" search --names-only "$KERNEL_PATTERN" |
  awk '{print $1}' | sort -V | tail -n1)"
[ -n "$kernel_pkg" ] || die "no $KERNEL_PATTERN in $KERNEL_SUITE-backports"
log "kernel package $kernel_pkg"
(cd "$cache/debs" && { ls "${kernel_pkg}"_*.deb >/dev/null 2>&1 || apt-get "${apt_opts[@]}" -qq download "$kernel_pkg"; })
kernel_deb="$(ls "$cache/debs/${kernel_pkg}"_*.deb | sort -V | tail -n1)"
mkdir -p "$work/kernel"
dpkg-deb -x "$kernel_deb" "$work/kernel"
# Debian 12's kernel ships its modules in /lib/modules, Debian 13's in /usr/lib/modules.
kmods="$work/kernel/lib/modules"
[ -d "$kmods" ] || kmods="$work/kernel/usr/lib/modules"
kver="$(ls "$kmods" | head -n1)"
[ -n "$kver" ] || die "no modules in $kernel_deb"

# 2. The root file system.
root="$work/root"
include="$(IFS=,; echo "${GUEST_PACKAGES[*]}")"
log "debootstrap --variant=minbase $SUITE (+ $include)"
mkdir -p "$cache/debs/debootstrap"
if ! debootstrap --variant=minbase --include="$include" --cache-dir="$cache/debs/debootstrap" \
  "$SUITE" "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
  tail -n 30 "$work/debootstrap.log" >&2
  [ -f "$root/debootstrap/debootstrap.log" ] && tail -n 30 "$root/debootstrap/debootstrap.log" >&2
  die "debootstrap failed"
fi

# 3. Modules: only what the lab loads (block, md/dm/bcache, virtio, ext4, 9p, crypto).
src="$kmods/$kver"
dst="$root/lib/modules/$kver"
mkdir -p "$dst/kernel"
cp -a "$src"/modules.order "$src"/modules.builtin* "$dst/"
for d in "${MODULE_DIRS[@]}"; do
  if [ -e "$src/kernel/$d" ]; then
    mkdir -p "$dst/kernel/$(dirname "$d")"
    cp -a "$src/kernel/$d" "$dst/kernel/$d"
  fi
done
# kmod may lack a decompressor for the kernel's module compression: unpack them.
find "$dst" -name '*.ko.xz' -exec xz -d {} +
find "$dst" -name '*.ko.zst' -exec zstd -q --rm -d {} +
chroot "$root" depmod "$kver"
for m in virtio_pci virtio_blk 9p 9pnet_virtio nbd ublk_drv bcache dm_cache dm_cache_smq ext4 loop; do
  pattern="(^|/)${m//_/[-_]}\.ko"
  if ! grep -qE "$pattern" "$dst/modules.dep" && ! grep -qE "$pattern" "$dst/modules.builtin"; then
    die "module $m neither built in nor in the trimmed tree"
  fi
done

# 4. Trim and configure.
# (python3 comes with fio for scripts the lab does not use; every MB less is
# 40 ms less per boot, the kernel unpacking the initramfs under TCG.)
rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,linda} "$root"/var/cache/apt/*.bin \
  "$root"/usr/lib/python3* "$root"/usr/bin/python3* "$root"/usr/share/python3* \
  "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/debootstrap
echo vmlab >"$root/etc/hostname"
# LVM without udev (no udevd in the guest).
sed -i -e 's/^\([[:space:]]*\)# *obtain_device_list_from_udev = .*/\1obtain_device_list_from_udev = 0/' \
  -e 's/^\([[:space:]]*\)# *udev_sync = .*/\1udev_sync = 0/' \
  -e 's/^\([[:space:]]*\)# *udev_rules = .*/\1udev_rules = 0/' "$root/etc/lvm/lvm.conf"
mkdir -p "$root"/{proc,sys,dev,run,tmp,results,vmlab}
cp "$work/kernel/boot/vmlinuz-$kver" "$work/vmlinuz"
(cd "$root" && find usr/lib/x86_64-linux-gnu -maxdepth 1 -name '*.so*' -printf '%f\n' | sort -u) >"$work/libs.txt"
echo "$kver" >"$work/kernel-release"
log "packing the initramfs"
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc) >"$work/rootfs.cpio"
cp "$work/debootstrap.log" "$work/build.log"
cp "$here/build-image.sh" "$work/recipe.sh"

# 5. Publish atomically; drop images of other recipes unused for two days
# (another checkout may still be using its own recipe's image).
rm -rf "$image.new"
mkdir -p "$image.new"
mv "$work"/{vmlinuz,rootfs.cpio,kernel-release,libs.txt,build.log,recipe.sh} "$image.new/"
date -u +%FT%TZ >"$image.new/done"
touch "$image.new/last-used"
rm -rf "$image"
mv "$image.new" "$image"
for old in "$cache"/image-*; do
  [ "$old" != "$image" ] || continue
  used="$old/last-used"
  [ -f "$used" ] || used="$old/done"
  if [ -z "$(find "$used" -mmin -2880 2>/dev/null)" ]; then
    rm -rf "$old"
  fi
done
log "built $image ($(du -sh "$image/rootfs.cpio" | cut -f1) initramfs, kernel $kver) in $(($(date +%s) - started)) s"
echo "$image"
