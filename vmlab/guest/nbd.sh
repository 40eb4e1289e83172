# Guest test: tiercache through the kernel's NBD client (nbd-client -unix).
# Disks: hdd (backing), ssd (cache). Two boots (the second after a crash).
# Run by vmlab/test.sh; by hand:
#   vmlab/run.sh --disk hdd=1G,iops=300 --disk ssd=256M vmlab/guest/nbd.sh
. /vmlab/lib.sh
# shellcheck disable=SC2034 # (read by cache-tests.sh)
FRONTEND=nbd
SOCKET=/run/tiercache/tc.sock

attach_device() {
  start_tiercache --socket "$SOCKET" "$@"
  wait_for_path "$SOCKET" 30
  modprobe nbd nbds_max=2
  DEV=/dev/nbd0
  nbd-client -unix "$SOCKET" "$DEV" -N default -b 4096 -t 120 >/dev/null
  local i=0
  while [ "$(cat /sys/block/nbd0/size)" = 0 ]; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || fail "$DEV has size 0 after nbd-client"
    sleep 0.1
  done
  step "$DEV connected: $(($(cat /sys/block/nbd0/size) * 512 >> 20)) MiB, write cache: $(cat /sys/block/nbd0/queue/write_cache)"
}

remove_device() {
  nbd-client -d "$DEV" >/dev/null
  local i=0
  while [ "$(cat /sys/block/nbd0/size)" != 0 ] || pgrep -x nbd-client >/dev/null; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || fail "$DEV still connected after nbd-client -d"
    sleep 0.1
  done
}

. /vmlab/cache-tests.sh
run_cache_tests
