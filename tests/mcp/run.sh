#!/bin/sh
# Runs the MCP tests (*.test.mjs here) with the official MCP TypeScript SDK (pinned in
# package-lock.json) as the client against a real `sbx serve`: over streamable HTTP to /mcp, and
# over stdio by spawning `sbx mcp`. Installs the pinned packages (npm ci, cached in WORK), starts
# the daemon on 127.0.0.1:0 with a temporary data directory, runs `node --test`, then checks that
# no sandbox is left and stops the daemon.
#
# usage: run.sh SBX_BINARY WORK_DIR
set -eu
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "mcp: node and npm are needed (Node 18+)" >&2
  exit 1
}
SBX=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # absolute: the tests spawn it from WORK
WORK=$2
HERE=$(cd "$(dirname "$0")" && pwd)

mkdir -p "$WORK"
# npm ci only when the lockfile changed since the last install.
if ! cmp -s "$HERE/package-lock.json" "$WORK/package-lock.json" || [ ! -d "$WORK/node_modules" ]; then
  cp "$HERE/package.json" "$HERE/package-lock.json" "$WORK/"
  (cd "$WORK" && npm ci --no-audit --no-fund --loglevel=error)
fi
rm -f "$WORK"/*.test.mjs "$WORK"/helpers.mjs
cp "$HERE"/*.test.mjs "$HERE"/helpers.mjs "$WORK/"

DATA=$(mktemp -d /tmp/sbx-mcp.XXXXXX)
chmod 711 "$DATA"  # the boxes' root must be able to traverse it
# --network off: the host's own network namespace is never changed by a test (tests/network).
"$SBX" --data-dir "$DATA" serve --listen 127.0.0.1:0 --network off >"$DATA/serve.log" 2>&1 &
DAEMON=$!
stop() {
  kill -TERM "$DAEMON" 2>/dev/null || true
  wait "$DAEMON" 2>/dev/null || true
}
trap 'stop' EXIT INT TERM
for _ in $(seq 1 100); do
  [ -s "$DATA/serve.port" ] && [ -s "$DATA/api-key" ] && break
  sleep 0.1
done
PORT=$(cat "$DATA/serve.port")
export SBX_BIN="$SBX"
export SBX_TEST_DATA_DIR="$DATA"
export SBX_TEST_URL="http://127.0.0.1:$PORT"
export SBX_TEST_KEY="$(cat "$DATA/api-key")"
# A second tenant, for the tests that one key cannot reach another's sessions and sandboxes.
SBX_TEST_OTHER_KEY=$("$SBX" --data-dir "$DATA" key create --name mcp-other 2>/dev/null)
export SBX_TEST_OTHER_KEY

rc=0
(cd "$WORK" && node --test --test-concurrency=2 ${MCP_FILTER:-*.test.mjs}) || rc=$?

# No sandbox may be left: every test kills what it creates. Leftovers fail the run and are killed.
left=$(node -e '
  const h = { Authorization: "Bearer " + process.env.SBX_TEST_KEY }
  const base = process.env.SBX_TEST_URL
  const r = await fetch(base + "/v1/sandboxes?state=running&state=paused", { headers: h })
  const { sandboxes } = await r.json()
  for (const b of sandboxes) await fetch(base + "/v1/sandboxes/" + b.id, { method: "DELETE", headers: h })
  console.log(sandboxes.map((b) => b.id).join(" "))
' --input-type=module)
if [ -n "$left" ]; then
  echo "mcp: sandboxes left behind: $left" >&2
  rc=1
fi
if [ "$rc" -ne 0 ]; then
  echo "mcp: daemon log (last 50 lines):" >&2
  tail -n 50 "$DATA/serve.log" >&2
fi
stop
trap - EXIT INT TERM
rm -rf "$DATA"
exit "$rc"
