# syntax=docker/dockerfile:1
# Container images of Pilotfish's two binaries: one build stage, two final targets.
#
#   docker build --target xds        -t pilotfish-xds:0.1.0 .
#   docker build --target controller -t pilotfish-controller:0.1.0 .
#
# `make images` runs both with the workspace version as the tag. The machines this project
# is developed and tested on have no Docker engine, so these builds are untested here:
# `make manifests-check` only lints this file with hadolint.
#
# The runtime image is distroless "cc" (glibc and libgcc, which the Rust binaries link;
# TLS is rustls with built-in roots, so no OpenSSL): no shell, no package manager, and the
# binaries run as the unprivileged user 65532 ("nonroot"), numeric so that Kubernetes can
# check `runAsNonRoot`.

ARG RUST_VERSION=1.95.0

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Only what the release build reads: the workspace manifests, every member crate (cargo
# loads all members even when it builds two binaries) and the vendored h2 the workspace
# patches in (vendor/h2/PILOTFISH.md).
COPY Cargo.toml Cargo.lock rust-toolchain.toml ./
COPY vendor vendor
COPY mesh mesh
COPY ca ca
COPY shared shared
COPY controller controller
COPY xds-server xds-server
COPY testkit testkit
# Cache mounts keep the registry and the target folder between builds; the binaries are
# copied out because a cache mount is not part of the stage's file system.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        --package pilotfish-xds --bin pilotfish-xds \
        --package pilotfish-controller --bin pilotfish-controller \
 && mkdir -p /out \
 && cp target/release/pilotfish-xds target/release/pilotfish-controller /out/

FROM gcr.io/distroless/cc-debian12:nonroot AS xds
LABEL org.opencontainers.image.title="pilotfish-xds" \
      org.opencontainers.image.description="Pilotfish xDS server: ADS for Envoy sidecars and proxyless gRPC clients" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/pilotfish-xds /usr/local/bin/pilotfish-xds
USER 65532:65532
# 15010: ADS (gRPC); 15014: admin HTTP (/healthz, /readyz, /metrics, /debug/*).
EXPOSE 15010 15014
ENTRYPOINT ["/usr/local/bin/pilotfish-xds"]

FROM gcr.io/distroless/cc-debian12:nonroot AS controller
LABEL org.opencontainers.image.title="pilotfish-controller" \
      org.opencontainers.image.description="Pilotfish controller: watches Kubernetes, publishes mesh snapshots to Redis" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/pilotfish-controller /usr/local/bin/pilotfish-controller
USER 65532:65532
# 15014: admin HTTP (/healthz, /readyz, /metrics, /debug/leader, /debug/snapshot).
EXPOSE 15014
ENTRYPOINT ["/usr/local/bin/pilotfish-controller"]
