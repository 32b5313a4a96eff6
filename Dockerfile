# syntax=docker/dockerfile:1
# The operator image for people with Docker: the same layout as `cargo xtask image` (which
# is what CI builds and runs): FROM scratch, the release binary, exactly the libraries it
# links, the CA roots, a nonroot user (65532). No shell. Plugins are not in the image: they
# come from the plugins ConfigMap (config/release/).
#
#   docker build -t proxy-operator:dev .
#
# The build stage stages the files with the xtask itself (`--rootfs-only`), so the layout
# is defined once, in xtask/src/image.rs.

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p proxy-operator --bin proxy-operator \
 && cargo xtask image --binary target/release/proxy-operator --rootfs-only /out/rootfs

FROM scratch
COPY --from=build /out/rootfs/ /
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/proxy-operator"]
CMD ["run"]
