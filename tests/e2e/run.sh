#!/bin/sh
# Runs the E2B SDK compatibility tests (*.test.mjs here) with the official npm packages against a
# real `sbx serve`: installs the pinned packages (npm ci, cached in WORK), starts the daemon on
# 127.0.0.1:0 with a temporary data directory, exports E2B_API_URL / E2B_SANDBOX_URL /
# E2B_API_KEY (spec 3.5), runs `node --test`, then checks that no sandbox is left and stops it.
#
# With FAKENET=path/to/fakenet.sh the daemon and the tests run in the daemon namespace of a fake
# internet (tests/network/fakenet.sh: nothing can leave the machine), the daemon with networking
# and the fake internet's DNS and CA, and the tests are the *.live.mjs files.
#
# With E2E_RUNTIME=NAME the daemon's default template runs under that runtime (tests that cannot
# pass there skip, saying why: helpers.mjs skipUnder).
#
# usage: [FAKENET=...] [E2E_RUNTIME=...] run.sh SBX_BINARY WORK_DIR
set -eu
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "e2e: node and npm are needed (Node 20+)" >&2
  exit 1
}
SBX=$1
WORK=$2
HERE=$(cd "$(dirname "$0")" && pwd)

mkdir -p "$WORK"
# npm ci only when the lockfile changed since the last install.
if ! cmp -s "$HERE/package-lock.json" "$WORK/package-lock.json" || [ ! -d "$WORK/node_modules" ]; then
  cp "$HERE/package.json" "$HERE/package-lock.json" "$WORK/"
  (cd "$WORK" && npm ci --no-audit --no-fund --loglevel=error)
fi
rm -f "$WORK"/*.test.mjs "$WORK"/*.live.mjs "$WORK"/helpers.mjs
cp "$HERE"/*.test.mjs "$HERE"/*.live.mjs "$HERE"/helpers.mjs "$WORK/"

DATA=$(mktemp -d /tmp/sbx-e2e.XXXXXX)
chmod 711 "$DATA"  # the boxes' root must be able to traverse it
IN_NS=""
NET_FLAGS="--network off"  # the host's own network namespace is never changed by a test
FILES=${E2E_FILTER:-*.test.mjs}
if [ -n "${FAKENET:-}" ]; then
  TAG=e2e$$
  "$FAKENET" up "$TAG" "$DATA/net"
  IN_NS="nsenter --net=/run/netns/sbxt-$TAG-d"
  NET_FLAGS="--network on --upstream-dns 198.18.0.53:53 --upstream-ca $DATA/net/ca.pem"
  FILES=${E2E_FILTER:-*.live.mjs}
fi
# shellcheck disable=SC2086 # the flags are words
$IN_NS "$SBX" --data-dir "$DATA" serve --listen 127.0.0.1:0 $NET_FLAGS >"$DATA/serve.log" 2>&1 &
DAEMON=$!
stop() {
  kill -TERM "$DAEMON" 2>/dev/null || true
  wait "$DAEMON" 2>/dev/null || true
  if [ -n "${FAKENET:-}" ]; then "$FAKENET" down "$TAG" "$DATA/net"; fi
}
trap 'stop' EXIT INT TERM
for _ in $(seq 1 600); do  # up to 60 s: the start probes the runtimes (gVisor: a real box)
  [ -s "$DATA/serve.port" ] && [ -s "$DATA/api-key" ] && break
  sleep 0.1
done
PORT=$(cat "$DATA/serve.port")
export E2B_API_KEY="$(cat "$DATA/api-key")"
export E2B_API_URL="http://127.0.0.1:$PORT"
export E2B_SANDBOX_URL="http://127.0.0.1:$PORT"
export SBX_DAEMON_PID="$DAEMON"  # for tests that watch the daemon's memory
# For tests that make a second key with the CLI (templates.test.mjs).
SBX_BIN=$(cd "$(dirname "$SBX")" && pwd)/$(basename "$SBX")
export SBX_BIN SBX_DATA_DIR="$DATA"
# With E2E_RUNTIME=NAME every sandbox of the default template runs under that runtime (`sbx
# template runtime`; E2B's `base` is an alias of `host`); one this host lacks skips the run (77).
if [ -n "${E2E_RUNTIME:-}" ]; then
  why=$($IN_NS node -e '
    const r = await fetch(process.env.E2B_API_URL + "/v1/runtimes",
                          { headers: { Authorization: "Bearer " + process.env.E2B_API_KEY } })
    const rt = (await r.json()).runtimes.find((x) => x.name === process.env.E2E_RUNTIME)
    if (!rt || !rt.available) console.log(rt ? rt.reason : "unknown runtime")
  ' --input-type=module)
  if [ -n "$why" ]; then
    echo "e2e: skipped: runtime $E2E_RUNTIME is not available here: $why" >&2
    exit 77
  fi
  "$SBX" --data-dir "$DATA" template runtime host "$E2E_RUNTIME" >/dev/null
fi

rc=0
# shellcheck disable=SC2086
(cd "$WORK" && $IN_NS node --test --test-concurrency=2 $FILES) || rc=$?

# No sandbox may be left: every test kills what it creates. Leftovers fail the run and are killed.
left=$($IN_NS node -e '
  const h = { "X-API-KEY": process.env.E2B_API_KEY }
  const base = process.env.E2B_API_URL
  const r = await fetch(base + "/v2/sandboxes?state=running,paused", { headers: h })
  const boxes = await r.json()
  for (const b of boxes) await fetch(base + "/sandboxes/" + b.sandboxID, { method: "DELETE", headers: h })
  console.log(boxes.map((b) => b.sandboxID).join(" "))
' --input-type=module)
if [ -n "$left" ]; then
  echo "e2e: sandboxes left behind: $left" >&2
  rc=1
fi
if [ "$rc" -ne 0 ]; then
  echo "e2e: daemon log (last 50 lines):" >&2
  tail -n 50 "$DATA/serve.log" >&2
fi
stop
trap - EXIT INT TERM
rm -rf "$DATA"
exit "$rc"
