# Shared by the CLI test scripts: results, and running `duet` as a user would. A script called as
# SCRIPT DUET_BINARY WORK_DIR sources it, then calls start_test "$@" (or sets $duet and enters its
# work directory itself).
# start_test DUET_BINARY WORK_DIR: sets duet and work, and makes WORK_DIR empty and the current
# directory.
start_test() {
  duet="$1"
  work="$2"
  rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
}
failures=0
pass() { echo "ok: $1"; }
failed() { echo "FAIL: $1"; failures=$((failures + 1)); }
# expect_ok NAME CMD...: the command succeeds
expect_ok() { local name="$1"; shift; if "$@" > out.txt 2> err.txt; then pass "$name"; else failed "$name (exit $?)"; cat err.txt; fi; }
# expect_fail NAME PATTERN CMD...: the command fails with exit 1 and stderr matching PATTERN
expect_fail() {
  local name="$1" pattern="$2"; shift 2
  "$@" > out.txt 2> err.txt; local rc=$?
  if [ "$rc" -eq 1 ] && grep -qE -- "$pattern" err.txt; then pass "$name"; else failed "$name (exit $rc)"; cat err.txt; fi
}
contains() { if grep -qE -- "$2" "$3"; then pass "$1"; else failed "$1: no /$2/ in $3"; head -20 "$3"; fi; }
