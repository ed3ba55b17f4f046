# syntax=docker/dockerfile:1
# The sidecar image: one static (musl) binary on distroless/static, nothing else — no libtorch,
# no shell, no libc. Build from the repository root:
#   docker build -f deploy/docker/sidecar.Dockerfile -t clawback-sidecar .
#
# CI builds the binary with the very same cargo command outside docker (scripts/test), and
# tests/tests/images.rs checks that this file's command, paths and copied folders match the
# repository, so the two cannot drift apart.

FROM rust:1.95-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/*
RUN rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY datapool datapool
COPY demo demo
COPY filters filters
COPY model model
COPY serve serve
COPY sidecar sidecar
COPY tests tests
COPY trainer trainer
RUN cargo build --release --locked --target x86_64-unknown-linux-musl -p clawback-sidecar --bin clawback-sidecar
# Measured here (2026-12-04): 96 MB as built (line tables of clawback's own crates), 37 MB stripped.
RUN strip target/x86_64-unknown-linux-musl/release/clawback-sidecar
# The data directory (spool, embedded store), owned by distroless's nonroot user.
RUN mkdir -p /out/var/lib/clawback

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/clawback-sidecar /usr/local/bin/clawback-sidecar
COPY --from=build --chown=65532:65532 /out/var/lib/clawback /var/lib/clawback
# All interfaces inside the container: the kubelet probes /readyz on the pod IP. Every other
# setting comes from --config, CLAWBACK_* variables or flags (deploy/clawback.example.toml).
ENV CLAWBACK_LISTEN=0.0.0.0:8100 \
    CLAWBACK_DATA_DIR=/var/lib/clawback
EXPOSE 8100
USER nonroot
ENTRYPOINT ["/usr/local/bin/clawback-sidecar"]
CMD ["serve"]
