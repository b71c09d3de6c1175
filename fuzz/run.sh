#!/bin/sh
# Runs every libFuzzer target of fuzz/ for FUZZ_SECONDS each (make fuzz), one after the other,
# from its committed seed corpus (read only) plus a working corpus under the build directory that
# keeps what earlier runs found. Prints each target's executions and result; exits 1 if any
# target crashed (its reproducer is left in $BUILD/fuzz/artifacts/<target>/).
#   usage: fuzz/run.sh BUILD_DIR [target...]     (FUZZ_SECONDS, default 60)
set -u
build=$1
shift
seconds=${FUZZ_SECONDS:-60}
src=$(cd "$(dirname "$0")" && pwd)
targets=${*:-"http_request json_body e2b_fields connect_envelope agent_frames_daemon agent_frames_agent tar_unpack layer_blob tls_client_hello dns_message dockerfile"}
failed=0
summary=""
for t in $targets; do
  bin=$build/fuzz/fuzz_$t
  work=$build/fuzz/corpus/$t
  art=$build/fuzz/artifacts/$t
  log=$build/fuzz/$t.log
  mkdir -p "$work" "$art"
  # halt_on_error: the first sanitizer report ends the run as a crash; leaks are reported too.
  ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:allocator_may_return_null=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$art/" "$work" "$src/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  if [ $rc -eq 0 ]; then result=ok; else result="CRASH (exit $rc, see $log and $art/)"; failed=1; fi
  line=$(printf '%-22s executions %-10s %s' "$t" "${execs:-?}" "$result")
  echo "$line"
  summary="$summary$line
"
done
printf '\nfuzz summary (%ss per target):\n%s' "$seconds" "$summary"
exit $failed
