#!/bin/sh
# The fake internet works as the network tests assume: from the daemon's namespace its DNS names
# resolve through /etc/netns, HTTPS verifies against its CA, pip downloads the index's wheel and
# npm installs the registry's package; and `down` leaves no namespace behind.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tag=self$$
dir=$(mktemp -d /tmp/sbx-fakenet.XXXXXX)
trap '"$here/fakenet.sh" down "$tag" "$dir"; rm -rf "$dir"' EXIT
"$here/fakenet.sh" up "$tag" "$dir"
in_d() { "$here/fakenet.sh" exec "$tag" "$@"; }
fail() {
  echo "fakenet selftest: $*" >&2
  exit 1
}

in_d curl -sf --max-time 10 --cacert "$dir/ca.pem" https://allowed.test/headers | grep -q '"host":"allowed.test"' ||
  fail "HTTPS to allowed.test"
grep -q '"name":"allowed.test"' "$dir/dns.jsonl" || fail "the DNS query was not logged"
in_d curl -s --max-time 10 http://nosuch.test/ && fail "nosuch.test resolved"
in_d env REQUESTS_CA_BUNDLE="$dir/ca.pem" /usr/bin/python3 -m pip download -q --no-deps \
  --index-url https://pypi.test/simple/ -d "$dir/dl" sbxdemo || fail "pip download"
[ -s "$dir/dl/sbxdemo-1.0-py3-none-any.whl" ] || fail "no wheel"
mkdir "$dir/npm"
in_d sh -c "cd '$dir/npm' && npm install -s --registry https://registry.test/ --cafile '$dir/ca.pem' \
  --no-audit --no-fund sbxdemo && node -e 'require(\"sbxdemo\")'" || fail "npm install"
"$here/fakenet.sh" down "$tag" "$dir"
ip netns list | grep -q "sbxt-$tag-" && fail "namespaces left"
echo "fakenet selftest: ok"
