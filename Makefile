# holdfast: small named targets; CI calls the same ones (.ci/run).
#   make run    build and start the daemon on its defaults
#   make test   everything the tests need is installed here, then every test runs
#   make lint   rustfmt and clippy, warnings are errors
#   make bench  side-by-side benchmark against memcached and redis-server
#   make soak   mixed hostile traffic on all three protocols for SOAK_SECONDS (CI: 60)

CARGO  ?= cargo
# make soak: how long the traffic runs; the daemon's timers are short so that they fire often.
SOAK_SECONDS ?= 600
SOAK_DAEMON_FLAGS ?= --threads 2 --orphan-timeout 200 --dlock-idle-timeout 2000
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Debian packages the tests use: memccapable (libmemcached's conformance tool).
APT_TEST_PACKAGES := libmemcached-tools

.PHONY: run build release test test-rust test-clients conformance deps deps-apt deps-python lint fmt bench soak fuzz clean

run: release
	./target/release/holdfast

build:
	$(CARGO) build --all-targets

release:
	$(CARGO) build --release --bins

test: deps test-rust test-clients conformance

test-rust:
	$(CARGO) test --all-targets

# Real client libraries (pymemcache, python-binary-memcached, protobuf) against the real daemon.
test-clients: deps-python release
	HOLDFAST_BIN=$(CURDIR)/target/release/holdfast $(PY) -m pytest -q tests/clients

# libmemcached's own conformance tool against holdfast.
conformance: deps-apt release
	$(PYTHON) tools/memccapable.py $(CURDIR)/target/release/holdfast

deps: deps-apt deps-python

# Install what is missing, once (a fresh machine has only Rust, gcc, Python and git).
deps-apt:
	@if ! command -v memccapable >/dev/null 2>&1; then \
		echo "installing $(APT_TEST_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_TEST_PACKAGES)) >/dev/null; \
	fi

deps-python: $(VENV)/.done

$(VENV)/.done: tests/clients/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r tests/clients/requirements.txt
	touch $@

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

bench: release
	$(PYTHON) tools/bench.py

# The soak starts the release daemon (port 0 everywhere), runs ~60 client threads against it,
# waits past every timeout, checks that nothing is left, stops the daemon by its PID.
soak: release
	./target/release/holdfast-soak --seconds $(SOAK_SECONDS) --holdfast ./target/release/holdfast -- $(SOAK_DAEMON_FLAGS)

clean:
	$(CARGO) clean
	rm -rf $(VENV)
