#!/usr/bin/env bash
# The contract under Schemathesis: a real idemd, built from this repository, started on
# a free loopback port with an auth file, and `st run` against the contract it serves,
# every check, every phase (stateful included), bounded in examples and time. Fails on
# any 5xx, any answer off its schema, any schema-valid request refused other than the
# documented refusals (hooks.py, docs/contract-fuzzing.md), and any schema-violating
# request accepted.
#
#   api/check/fuzz/run.sh IDEMD_BINARY ST_BINARY
#
# FUZZ_EXAMPLES (100) bounds the examples per operation, FUZZ_STATEFUL_SECONDS (60) the
# stateful phase, FUZZ_SEED (1) fixes the run, FUZZ_MAX_TIME (900) bounds each st run in
# seconds.
set -euo pipefail
idemd=$(realpath "$1")
st=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# One tenant, one token with the scopes every operation needs (platform for the backup); the file keeps its hash.
token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
hash=$(printf %s "$token" | sha256sum | cut -d' ' -f1)
cat >"$work/auth.yaml" <<YAML
tenants:
  fuzz: {}
tokens:
  - name: contract-fuzz
    tenant: fuzz
    scopes: [use, admin, platform]
    sha256: $hash
YAML

"$idemd" --listen 127.0.0.1:0 --auth-file "$work/auth.yaml" --data-dir "$work/data" \
  >"$work/idemd.log" 2>&1 &
pid=$!
# The address idemd chose is in its first log line; wait for it, for at most 60 s.
addr=
for _ in $(seq 600); do
  addr=$(grep -o '"addr":"127.0.0.1:[0-9]*"' "$work/idemd.log" | head -1 | cut -d'"' -f4 || true)
  [ -n "$addr" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/idemd.log"; echo "idemd exited before listening" >&2; exit 1; }
  sleep 0.1
done
[ -n "$addr" ] || { cat "$work/idemd.log"; echo "idemd did not listen within 60 s" >&2; exit 1; }

echo "== Schemathesis against idemd on $addr"
cd "$work" # where Schemathesis keeps its cache
fuzz() {
  SCHEMATHESIS_HOOKS=hooks PYTHONPATH="$here" timeout "${FUZZ_MAX_TIME:-900}" "$st" run "http://$addr/openapi.yaml" \
    --checks all \
    --max-response-time "$answer_within" \
    --header "Authorization: Bearer $token" \
    --seed "${FUZZ_SEED:-1}" \
    --workers 1 \
    --request-timeout "$answer_within" \
    --no-color "$@"
}
status=0
# A claim waits up to wait_ms, at most 30 s, for a holder. The check of response times
# (10 s unless told) and the request timeout allow for that wait and for a slow, busy
# machine: 30 s plus 30 s times IDEMD_TEST_SLOWDOWN (3 unless set), as the tests' waits.
answer_within=$(awk -v f="${IDEMD_TEST_SLOWDOWN:-3}" 'BEGIN { print 30 + 30 * f }')
# Examples, the schemas' edges and random requests, a number per operation.
fuzz --phases examples,coverage,fuzzing --max-examples "${FUZZ_EXAMPLES:-100}" || status=$?
# Sequences that follow the links, scenario after scenario for a time: one suite of
# scenarios from one seed may stop after a few.
fuzz --phases stateful --max-time "${FUZZ_STATEFUL_SECONDS:-60}" || status=$?
if [ $status -ne 0 ]; then
  echo "== idemd's log"; tail -50 "$work/idemd.log"
fi
exit $status
