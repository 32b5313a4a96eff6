# syntax=docker/dockerfile:1
# The operator image: the proxy-operator binary and the public CA roots, nothing else.
# Plugins are not in the image; they come from the plugins ConfigMap (config/release/).
#
#   docker build -t ghcr.io/egress-proxies/proxy-operator:0.1.0 .
#
# The binary links glibc (wasmtime, ring), so the runtime is distroless "cc" (glibc,
# libgcc, CA certificates, /etc/passwd with nonroot) rather than "static".

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Only the operator binary: the plugin crates are wasm32 cdylibs, built by
# `cargo xtask build-plugins`, not here.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p proxy-operator --bin proxy-operator \
 && install -D -m 0755 target/release/proxy-operator /out/proxy-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/proxy-operator /usr/local/bin/proxy-operator
# 65532 is distroless's nonroot user; manager.yaml runs as the same numeric IDs.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/proxy-operator"]
CMD ["run"]
