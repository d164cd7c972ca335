# The one command that runs every test of every language: `make test`. It first installs
# what the machine lacks (.ci/deps: Debian packages when run as root, else it stops and
# prints the apt-get line; helm and kubernetes-validate), and turns every test's skip
# for a missing server or tool into a failure, so that it runs every test. It runs every
# language's suite even when an earlier one fails, prints which passed and which failed,
# and fails at the end if any did.
# Each language has its own target, so `make test-go` (or -ts, -python) runs one, and
# skips what the machine lacks.

.PHONY: test test-busy deps test-go test-ts test-python test-java test-contract-fuzz bench-java check-contract check-ts-generated generate-python generate-java payments-api

# The pinned tools .ci/deps installs: helm in the Go bin directory, kubernetes-validate
# under the tools cache.
TOOLS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/idemd-ci
export PATH := $(PATH):/usr/local/go/bin:$(shell go env GOPATH 2>/dev/null)/bin:$(TOOLS)/bin

# Every suite, each language's and the contract's fuzz, which make test runs one after
# the other, each even when an earlier one failed, and fails at the end if any did.
SUITES := test-go test-ts test-python test-java test-contract-fuzz

test: export IDEMD_REQUIRE_REDIS = 1
test: export IDEMD_REQUIRE_POSTGRES = 1
test: export IDEMD_REQUIRE_RABBITMQ = 1
test: export IDEMD_REQUIRE_NETNS = 1
test: export IDEMD_REQUIRE_DEPLOY_TOOLS = 1
test: export IDEMD_REQUIRE_BROWSER = 1
test: export IDEMD_REQUIRE_FLOOR = 1
test: export IDEMD_REQUIRE_S3 = 1
test: deps
	@passed=; failed=; \
	for suite in $(SUITES); do \
		if $(MAKE) $$suite; then passed="$$passed $$suite"; else failed="$$failed $$suite"; fi; \
	done; \
	echo "== passed:$${passed:- none}"; echo "== failed:$${failed:- none}"; \
	test -z "$$failed"

# make test with the machine kept busy: one busy loop per core for as long as the tests
# run (at most BUSY_SECONDS), which shows the waits of every test are long enough for a
# machine much slower than this one (see .ci/busy).
BUSY_SECONDS ?= 5400
test-busy:
	bash .ci/busy $(BUSY_SECONDS) $(MAKE) test

deps:
	bash .ci/deps

# The Python client's venv (see test-python), which the payments example uses too.
PYTHON ?= python3
PY := clients/python
PYVENV := $(PY)/.venv

# The Go tests start their own redis-server processes and idemd daemons on free
# loopback ports; without redis-server on the PATH the Redis tests say so and skip.
# The payments example's test (examples/payments) also runs its API with node and its
# Python charger in the Python client's venv, and starts RabbitMQ and PostgreSQL.
# A package's tests may take far longer than go test's default ten minutes on a busy
# machine (cmd/idemd does under make test-busy); GOTEST_TIMEOUT bounds only a hang.
GOTEST_TIMEOUT ?= 40m
test-go: payments-api $(PYVENV)/installed
	go test -race -timeout $(GOTEST_TIMEOUT) ./... ./clients/go/...

# The TypeScript client: its linter, the strict compile of all its code, and its tests,
# which build idemd from this repository and run real Express and Fastify apps (and a
# redis-server of their own for a daemon over Redis).
# npm ci runs whenever node_modules is missing or older than package-lock.json.
test-ts: clients/ts/node_modules/.package-lock.json
	cd clients/ts && npm run lint && npm test

clients/ts/node_modules/.package-lock.json: clients/ts/package-lock.json
	cd clients/ts && npm ci --no-audit --no-fund

# The payments example's API, built against the TypeScript client it links to.
PAYAPI := examples/payments/api
payments-api: clients/ts/node_modules/.package-lock.json $(PAYAPI)/node_modules/.package-lock.json
	cd clients/ts && npm run build
	cd $(PAYAPI) && npm run lint && npm run build

$(PAYAPI)/node_modules/.package-lock.json: $(PAYAPI)/package-lock.json clients/ts/node_modules/.package-lock.json
	cd $(PAYAPI) && npm ci --no-audit --no-fund

# The committed client in clients/ts/src/gen is what the pinned generator makes of the contract.
check-ts-generated: clients/ts/node_modules/.package-lock.json
	cd clients/ts && npm run check-generated

# The contract passes Redocly's strict lint, and strict TypeScript callers compile against
# clients that openapi-typescript and @hey-api/openapi-ts generate from it. OpenAPI
# Generator's Java client (clients/java/idemd-api) is generated from it without a warning
# and compiles.
check-contract: api/check/node_modules/.package-lock.json generate-java
	cd api/check && npm run check
	cd $(JAVA) && $(MVN) -pl idemd-api compile

api/check/node_modules/.package-lock.json: api/check/package-lock.json
	cd api/check && npm ci --no-audit --no-fund

# The contract under Schemathesis (api/check/fuzz/run.sh): idemd built here, on a free
# loopback port with an auth file, every check and phase, stateful included, bounded by
# FUZZ_EXAMPLES per operation. Schemathesis, pinned, lives in a venv of its own under the
# tools cache, made on first use and again when its requirements change.
STVENV := $(TOOLS)/schemathesis
test-contract-fuzz: $(STVENV)/installed
	mkdir -p api/check/fuzz/target
	go build -o api/check/fuzz/target/idemd ./cmd/idemd
	api/check/fuzz/run.sh api/check/fuzz/target/idemd $(STVENV)/bin/st

$(STVENV)/installed: api/check/fuzz/requirements.txt
	$(PYTHON) -m venv $(STVENV)
	$(STVENV)/bin/pip install --quiet --disable-pip-version-check -r api/check/fuzz/requirements.txt
	cp api/check/fuzz/requirements.txt $@

# The Python client's checks and tests run in clients/python/.venv, made on first use
# (and again when its pinned requirements change) with the python3 on the PATH (3.11+).

$(PYVENV)/installed: $(PY)/requirements-dev.txt
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "clients/python needs Python 3.11 or later")'
	$(PYTHON) -m venv $(PYVENV)
	$(PYVENV)/bin/pip install --quiet --disable-pip-version-check -r $(PY)/requirements-dev.txt
	touch $@

test-python: $(PYVENV)/installed
	cd $(PY) && .venv/bin/ruff format --check && .venv/bin/ruff check && .venv/bin/mypy
	cd $(PY) && .venv/bin/ruff format --check ../../examples/payments/charger.py && \
		.venv/bin/ruff check ../../examples/payments/charger.py && \
		MYPYPATH=examples .venv/bin/mypy --strict --ignore-missing-imports ../../examples/payments/charger.py
	cd $(PY) && .venv/bin/python -m pytest -q

# The Java client: the system's Maven (3.8 or later) and JDK (17 or later) build every
# module of clients/java and run its tests, which start idemd built here (IDEMD_BIN) and
# real Tomcat and Spring Boot servers (and a redis-server of their own for a daemon over
# Redis). MAVEN_OPTS=-Dmaven.repo.local=… moves Maven's cache.
JAVA := clients/java
MVN ?= mvn -B -q
test-java:
	go build -o $(JAVA)/target/idemd ./cmd/idemd
	cd $(JAVA) && IDEMD_BIN=$$PWD/target/idemd $(MVN) verify

# Whether batching pays in the Java client: batching on and off in alternating rounds
# against one idemd, with the CPU each process spends per cycle (docs/benchmarks.md).
BENCH_ARGS ?= 32 5 3
bench-java:
	go build -o $(JAVA)/target/idemd ./cmd/idemd
	cd $(JAVA) && $(MVN) install -DskipTests && $(MVN) -pl idemd-client \
		org.apache.maven.plugins:maven-dependency-plugin:3.8.1:build-classpath -Dmdep.outputFile=target/classpath.txt
	cd $(JAVA)/idemd-client && IDEMD_BIN=../target/idemd java -cp "target/test-classes:target/classes:$$(cat target/classpath.txt)" \
		io.idemd.BatchBench $(BENCH_ARGS)

# Regenerate the Java low-level client from the contract; any warning of the generator
# fails it (CI checks that this leaves no diff).
generate-java:
	rm -rf $(JAVA)/idemd-api/src/main/java $(JAVA)/idemd-api/.openapi-generator
	mkdir -p $(JAVA)/target
	cd $(JAVA) && mvn -B -Pgenerate generate-sources -pl idemd-api > target/generate.log 2>&1 || { cat target/generate.log; exit 1; }
	! grep -E 'WARN|ERROR' $(JAVA)/target/generate.log

# Regenerate the low-level client from the contract (CI checks that this leaves no diff).
generate-python: $(PYVENV)/installed
	rm -rf $(PY)/src/idemd/idemapi
	cd $(PY) && PATH="$$PWD/.venv/bin:$$PATH" .venv/bin/openapi-python-client generate \
		--path ../../api/openapi.yaml --config openapi-python-client.yaml --meta none \
		--output-path src/idemd/idemapi
