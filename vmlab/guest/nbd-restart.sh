# Guest test: the kernel NBD device outlives its server: `tiercache serve
# --nbd-device /dev/nbd0` configures the kernel's NBD client itself
# (netlink, with a dead-connection timeout) and the next server takes the
# device over (RECONFIGURE with a new connection); see docs/RESTART.md.
# The restart test of restart-lib.sh (kill -9 rounds, an upgrade, then
# every check) over it; also: the device is configured with the server's
# backend identifier, and a server of another cache is refused it.
# Run it alone with:
#   vmlab/run.sh --disk hdd=1G,iops=300 --disk ssd=256M vmlab/guest/nbd-restart.sh
. /vmlab/lib.sh
# shellcheck disable=SC2034 # (read by restart-lib.sh and cache-tests.sh)
FRONTEND=nbd-restart
# shellcheck disable=SC2034
SERVE_FRONT=(--socket /run/tiercache/tc.sock --nbd-device /dev/nbd0)
. /vmlab/restart-lib.sh

modprobe nbd nbds_max=2

find_device() {
  DEV=/dev/nbd0
  grep -q "tiercache: serving /dev/nbd0" "$LOG" || { tail -n 20 "$LOG"; fail "tiercache did not announce /dev/nbd0"; }
  local size
  size=$(cat /sys/block/nbd0/size)
  [ "$size" -gt 0 ] || fail "/dev/nbd0 has size 0 after serve --nbd-device"
  grep -q "^tiercache:.*#default$" /sys/block/nbd0/backend || fail "/dev/nbd0's backend is $(cat /sys/block/nbd0/backend)"
  # One hardware queue: the kernel's default would be mq-deadline; the
  # server sets none (crates/frontend/src/scheduler.rs).
  grep -q '\[none\]' /sys/block/nbd0/queue/scheduler || fail "/dev/nbd0's IO scheduler is $(cat /sys/block/nbd0/queue/scheduler), expected [none]"
  step "/dev/nbd0: $((size * 512 >> 20)) MiB, write cache: $(cat /sys/block/nbd0/queue/write_cache), io_timeout $(cat /sys/block/nbd0/queue/io_timeout) ms"
}

refuse_intruder() {
  if tiercache serve --backing mem:64M --socket /run/intruder.sock --nbd-device /dev/nbd0 \
    --control /run/intruder.ctl >"$OUT/intruder.log" 2>&1; then
    fail "a server of another cache took /dev/nbd0 over"
  fi
  grep -q "in use by another client" "$OUT/intruder.log" || { cat "$OUT/intruder.log"; fail "the refusal does not say why"; }
}

assert_device_kept() {
  [ "$(cat /sys/block/nbd0/size)" -gt 0 ] || fail "$DEV lost its configuration with the hand-over"
}

assert_device_gone() {
  local i=0
  while [ "$(cat /sys/block/nbd0/size)" != 0 ]; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || fail "$DEV is still configured 10 s after SIGTERM"
    sleep 0.1
  done
}

run_restart_test
