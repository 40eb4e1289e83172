# Guest test: the ublk device outlives its server (user recovery; see
# docs/RESTART.md): the restart test of restart-lib.sh (kill -9 rounds, an
# upgrade, then every check) over `tiercache serve --ublk`.
# Run it alone with:
#   vmlab/run.sh --disk hdd=1G,iops=300 --disk ssd=256M vmlab/guest/ublk-restart.sh
. /vmlab/lib.sh
# shellcheck disable=SC2034 # (read by restart-lib.sh and cache-tests.sh)
FRONTEND=ublk-restart
# shellcheck disable=SC2034
SERVE_FRONT=(--ublk --ublk-queues 2)
# UBLK_ZERO_COPY=1: with --ublk-zero-copy (Linux >= 6.16, VMLAB_KERNEL=6.18):
# the device is made zero-copy and every server that takes it over must
# serve it so.
[ "${UBLK_ZERO_COPY:-0}" = 1 ] && SERVE_FRONT+=(--ublk-zero-copy)
STATE=/run/tiercache/tc.ublk-id # next to $TC_CONTROL (serve --ublk)
. /vmlab/restart-lib.sh

modprobe ublk_drv
[ -e /dev/ublk-control ] || fail "no /dev/ublk-control after modprobe ublk_drv"
rm -f "$STATE"

find_device() {
  DEV=$(grep -o "serving /dev/ublkb[0-9]*" "$LOG" | tail -n 1 | cut -d' ' -f2)
  [ -n "$DEV" ] || fail "tiercache did not announce its device"
  grep -q "user recovery on" "$LOG" || fail "the device was not made with user recovery"
  [ "$(cat "$STATE")" = "${DEV#/dev/ublkb}" ] || fail "$STATE does not name ${DEV#/dev/ublkb}"
}

refuse_intruder() {
  if tiercache serve --backing mem:64M --ublk --ublk-id "${DEV#/dev/ublkb}" --control /run/intruder.ctl \
    >"$OUT/intruder.log" 2>&1; then
    fail "a second server took over a device served by a live process"
  fi
  grep -q "being served by a live process" "$OUT/intruder.log" || { cat "$OUT/intruder.log"; fail "the refusal does not say why"; }
}

assert_device_kept() {
  [ -e "/sys/block/${DEV#/dev/}" ] || fail "$DEV went away with the hand-over"
}

assert_device_gone() {
  local i=0
  while [ -e "/dev/ublkc${DEV#/dev/ublkb}" ]; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || fail "the device still exists 10 s after SIGTERM"
    sleep 0.1
  done
  [ ! -e "$STATE" ] || fail "$STATE left after a plain stop"
  if [ "${UBLK_ZERO_COPY:-0}" = 1 ]; then
    local starts zc
    starts=$(grep -c "serving /dev/ublkb" "$LOG")
    zc=$(grep -c "ublk[0-9]*: zero copy" "$LOG")
    [ "$zc" -gt 0 ] && [ "$zc" = "$starts" ] || fail "$zc of $starts servers served the device with zero copy"
    step "every one of the $starts servers served $DEV with zero copy"
  fi
}

run_restart_test
