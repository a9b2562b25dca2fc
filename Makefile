# Pilotfish — see README.md. Every target works on a fresh machine.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build test test-deps lint unit integration crds crds-check descriptors descriptors-check manifests manifests-check images bench bench-load bench-discovery bench-reconnect fuzz run demo

all: build

build:
	$(CARGO) build --workspace --bins

## Installs what the tests need (redis-server, kubectl/helm, Python venvs).
test-deps:
	./scripts/install-test-deps.sh

## Formatting; no import cycle between modules (scripts/check-module-cycles.py, after its
## own tests); clippy; the domain crate (mesh/) free of I/O dependencies
## (scripts/check-mesh-deps.sh); rustdoc (broken or private intra-doc links, bare URLs).
lint:
	$(CARGO) fmt --all --check
	python3 -m unittest discover -q -s scripts -p 'test_*.py'
	./scripts/check-module-cycles.py
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	./scripts/check-mesh-deps.sh
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --workspace

## Unit tests run in parallel; process-level integration tests run serially, after the
## binaries they start have been built.
unit:
	$(CARGO) test --workspace --lib --bins
	$(CARGO) test --workspace --doc

integration: build
	$(CARGO) test --workspace --test "*" -- --test-threads=1

test: test-deps lint crds-check descriptors-check manifests-check unit integration

crds:
	./scripts/gen-crds.sh

crds-check:
	./scripts/gen-crds.sh --check

## The plain manifests (manifests/pilotfish.yaml) and the chart README's Parameters table,
## both generated from the Helm chart in manifests/helm/pilotfish. After `make crds`, run this too.
manifests:
	./scripts/gen-manifests.sh

## Drift check of the above, then helm lint, kubernetes-validate, checkov and hadolint.
manifests-check:
	./scripts/gen-manifests.sh --check
	./scripts/check-chart.sh

## Container images of both binaries (needs a Docker engine with BuildKit; untested on the
## project's machines, which have none). IMAGE_REGISTRY=registry.example.com/mesh prefixes the names.
VERSION := $(shell sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
IMAGE_REGISTRY ?=
IMAGE_PREFIX := $(if $(IMAGE_REGISTRY),$(IMAGE_REGISTRY)/,)
images:
	@docker info >/dev/null 2>&1 || { echo "make images needs a running Docker engine (docker info failed)" >&2; exit 1; }
	DOCKER_BUILDKIT=1 docker build --target xds -t $(IMAGE_PREFIX)pilotfish-xds:$(VERSION) .
	DOCKER_BUILDKIT=1 docker build --target controller -t $(IMAGE_PREFIX)pilotfish-controller:$(VERSION) .

## The Envoy descriptor set pilotfish-xds embeds for proto JSON, derived from envoy-types.
descriptors:
	./scripts/gen-envoy-descriptors.sh

descriptors-check:
	./scripts/gen-envoy-descriptors.sh --check

bench:
	$(CARGO) bench --workspace

## The ADS load benchmark (not part of `make test`; ~15 minutes): release pilotfish-xds on
## the reference mesh (1,000 services, 2,000 streams) and 100 services with 5,000 streams,
## SotW and delta, against a null server that only replays the same bytes (docs/PERFORMANCE.md).
bench-load:
	./scripts/bench-load.sh

## The memory bound of MeshConfig discoverySelectors (about a minute; not part of `make
## test`): controller RSS with 10x as many unselected namespaces (Pods, Services,
## EndpointSlices) against the baseline, bound 1.2x (docs/PERFORMANCE.md).
bench-discovery:
	$(CARGO) build --bin pilotfish-controller --bin pilotfish-test-apiserver
	$(CARGO) test -p pilotfish-testkit --test e2e controller_discovery -- --ignored --nocapture
## The mass-reconnect run (not part of `make test`; a few minutes): three release replicas,
## 2,000 streams, one replica killed by PID, its streams back on the others with Envoy's
## backoff while an edit is pushed (docs/PERFORMANCE.md, "Mass reconnect").
bench-reconnect:
	./scripts/bench-reconnect.sh

## Coverage-guided fuzzing (cargo-fuzz) of the snapshot decoder, the YAML parser and the
## SotW and delta ADS state machines, FUZZ_SECONDS (default 60) per target; fails on any crash.
## Uses the nightly toolchain if present, else RUSTC_BOOTSTRAP=1. See scripts/fuzz.sh.
fuzz:
	./scripts/fuzz.sh

## Standalone xDS server on the bundled bookinfo example (no cluster, no Redis).
run:
	$(CARGO) run --bin pilotfish-xds -- --config-dir examples/bookinfo --xds-addr 127.0.0.1:15010 --admin-addr 127.0.0.1:15014

## Routes real RPCs through standalone mode with gRPC's own xDS client (about a minute).
demo:
	./scripts/deps/python-grpc.sh
	$(CARGO) build --bin pilotfish-xds --bin pilotfish-demo
	$(CARGO) run --bin pilotfish-demo
