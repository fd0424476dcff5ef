#!/usr/bin/env bash
# (The team's shared tool ../shared/tools/hog.sh, kept here so that the tests run without it.)
# A bounded CPU hog that switches on and off, to try a sweep on a machine whose load changes.
#   hog.sh [--procs N] [--on S] [--off S] [--total S] [--start on|off]
# Defaults: 3 busy processes, 10 s on, 20 s off, 300 s in all, starting on. Every process it starts
# is killed by pid when it ends, is interrupted, or runs out of --total. Prints each switch.
set -u
procs=3; on=10; off=20; total=300; start=on
while [ $# -gt 0 ]; do
  case "$1" in
    --procs) procs=$2; shift 2 ;; --on) on=$2; shift 2 ;; --off) off=$2; shift 2 ;;
    --total) total=$2; shift 2 ;; --start) start=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; pids=(); }
trap 'stop; exit 0' INT TERM EXIT
end=$(( $(date +%s) + total )); state=$start
while [ "$(date +%s)" -lt "$end" ]; do
  if [ "$state" = on ]; then
    # each hog in its own session, as other jobs are: the kernel shares CPU between sessions
    for _ in $(seq "$procs"); do setsid timeout "$((on + 2))" python3 -c 'while True: pass' & pids+=($!); done
    echo "$(date +%T) hog on ($procs processes)"; sleep "$on"; stop; state=off
  else
    echo "$(date +%T) hog off"; sleep "$off"; state=on
  fi
done
