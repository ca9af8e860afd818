# syntax=docker/dockerfile:1
# tollgate, plus the demo binaries (demo-provider, demo-workers) that docker-compose.yml runs.
#
#   docker build -t tollgate .
#   docker run --rm -p 8080:8080 -v "$PWD/my.toml:/etc/tollgate/tollgate.toml:ro" tollgate
#
# The config must listen on 0.0.0.0 to be reachable from outside the container (see config/compose.toml).
# Checked without Docker by scripts/check-compose: keep the COPY lines' shape.

FROM rust:1-bookworm AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY lua ./lua
COPY src ./src
# Caches keep the registry and the build between image builds; the binaries are copied out of them.
# Release builds keep line tables (profile.release.debug = 1); the image drops them.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    CARGO_PROFILE_RELEASE_STRIP=debuginfo cargo build --release --locked --bins \
 && mkdir -p /out \
 && cp target/release/tollgate target/release/demo-provider target/release/demo-workers /out/

FROM debian:bookworm-slim
# No packages: TLS roots are built in (webpki-roots) and the health check is bash's /dev/tcp.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin tollgate
COPY --from=builder /out/tollgate /out/demo-provider /out/demo-workers /usr/local/bin/
COPY scripts/healthz /usr/local/bin/healthz
COPY config/example.toml /etc/tollgate/example.toml
USER tollgate
EXPOSE 8080
# The admin listener's /healthz (server.admin_listen; 127.0.0.1:9090 in config/compose.toml).
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=3 CMD ["healthz", "9090"]
CMD ["tollgate", "run", "--config", "/etc/tollgate/tollgate.toml"]
