# syntax=docker/dockerfile:1
# The trainer image: clawback-trainer on PyTorch's CUDA runtime image, linking that image's
# libtorch (tch needs exactly the PyTorch minor version scripts/ensure-torch pins). Build from
# the repository root:
#   docker build -f deploy/docker/trainer.Dockerfile -t clawback-trainer .
#
# CI builds the binary with the very same cargo command outside docker (scripts/test), and
# tests/tests/images.rs checks that this file's command, paths, copied folders and PyTorch
# version match the repository.

ARG PYTORCH_TAG=2.13.0-cuda12.8-cudnn9

FROM pytorch/pytorch:${PYTORCH_TAG}-devel AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl pkg-config \
    && rm -rf /var/lib/apt/lists/*
ARG RUST_VERSION=1.95.0
RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
    | sh -s -- -y --profile minimal --default-toolchain ${RUST_VERSION}
ENV PATH=/root/.cargo/bin:${PATH}
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
COPY datapool datapool
COPY demo demo
COPY filters filters
COPY model model
COPY serve serve
COPY sidecar sidecar
COPY tests tests
COPY trainer trainer
# .cargo/config.toml hands `.torch` to torch-sys as LIBTORCH; link it to this image's torch,
# as scripts/ensure-torch links it to the venv's.
RUN ln -sfn "$(python -c 'import os, torch; print(os.path.dirname(torch.__file__))')" .torch
RUN cargo build --release --locked -p clawback-trainer --bin clawback-trainer

FROM pytorch/pytorch:${PYTORCH_TAG}-runtime
# trainer/build.rs bakes /src/.torch/lib into the binary's rpath: the same link here points it
# at this image's libtorch.
RUN mkdir -p /src \
    && ln -sfn "$(python -c 'import os, torch; print(os.path.dirname(torch.__file__))')" /src/.torch
COPY --from=build /src/target/release/clawback-trainer /usr/local/bin/clawback-trainer
ENTRYPOINT ["/usr/local/bin/clawback-trainer"]
