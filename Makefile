# The one command that runs every test of every language: `make test`.
# Each language has its own target, so `make test-go` (or -ts, -python) runs one.

.PHONY: test test-go test-ts test-python

test: test-go test-ts test-python

# The Go tests start their own redis-server processes and idemd daemons on free
# loopback ports; without redis-server on the PATH the Redis tests say so and skip.
test-go:
	go test -race ./... ./clients/go/...

test-ts:

test-python:
