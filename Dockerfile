# syntax=docker/dockerfile:1
#
# Images of the payments service, in three stages:
#
#   builder  compiles payments-api and card-sim (release) with the pinned toolchain.
#   e2e      the builder plus the pre-built black-box test target crates/api/tests/e2e.rs;
#            it runs `cargo test --test e2e` against a running service (E2E_BASE_URL).
#   runtime  Debian slim with only the two binaries, run as a non-root user. It is the last
#            stage, so a plain `docker build .` produces it.
#
#   docker build -t payments-service:local .                    # the runtime image
#   docker build --target e2e -t payments-service-e2e:local .   # the e2e test runner
#
# docker-compose.yml builds both and wires them to PostgreSQL, Redis and each other.
# Needs BuildKit (the default builder since Docker 23): it builds only the stages the target
# needs, so `docker build .` does not compile the e2e tests.

# ---------------------------------------------------------------------------------------------
FROM rust:1.95-slim-bookworm AS builder
WORKDIR /src

# rust-toolchain.toml pins an exact toolchain (and clippy, rustfmt). The image's toolchain may
# be a different 1.95 point release, in which case rustup would fetch the pinned one on the
# first cargo call. Doing that here, from the toolchain file alone, keeps the download in its
# own layer, reused until the file changes, instead of repeating it after every source change.
COPY rust-toolchain.toml ./
RUN rustup toolchain install && cargo --version

# Only what the build reads. migrations/ is needed at compile time: sqlx::migrate!() embeds
# the SQL files into the binary, so the runtime image needs no migrations directory.
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY migrations ./migrations

# --locked: build exactly the versions in Cargo.lock, and fail instead of updating it.
# No BuildKit cache mounts for target/ or the cargo registry on purpose: the e2e stage below
# starts from this stage and runs cargo again, at build time and when its container starts,
# so the compiled dependencies and downloaded crates must be part of the image layers (a
# cache mount's contents are not). The binaries stay at their usual target/release paths.
RUN cargo build --release --locked -p payments-api -p payments-card-sim

# ---------------------------------------------------------------------------------------------
# The black-box end-to-end tests, run from their own container against the composed stack
# (docker compose --profile e2e run --rm e2e). The test target is compiled now, reusing the
# release dependencies built above, so the container only runs it: at start cargo finds the
# sources unchanged and runs the existing binary. The target reads the service's URL from
# E2E_BASE_URL, which docker-compose.yml sets (http://payments-api:8080); the image sets no
# default, as the right address depends on where the service runs.
FROM builder AS e2e
RUN cargo test --release --locked -p payments-api --test e2e --no-run
CMD ["cargo", "test", "--release", "--locked", "-p", "payments-api", "--test", "e2e"]

# ---------------------------------------------------------------------------------------------
# Same Debian release as the builder image (bookworm), so the binaries find the glibc they
# were linked against. TLS is rustls (no OpenSSL), so the only library-like need is the CA
# bundle for outgoing HTTPS; curl is there for the compose healthchecks.
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*

# Run as a non-root user, so a compromised process cannot modify the binaries or system files.
# The uid/gid is fixed (10001, clear of the system range and of the 1000 a host gives its first
# user), so file ownership on mounted volumes is predictable from one build to the next.
RUN groupadd --system --gid 10001 payments \
    && useradd --system --uid 10001 --gid payments --home-dir /home/payments --create-home \
        --shell /usr/sbin/nologin payments

COPY --from=builder /src/target/release/payments-api /src/target/release/card-sim /usr/local/bin/

USER payments
# The working directory is the user's own home, so whatever the service writes at a relative
# path (such as a SQLite database file under data/, when DATABASE_URL names no server) can be
# created there. docker-compose.yml points DATABASE_URL at PostgreSQL instead.
WORKDIR /home/payments

# 8080: payments-api; 9090: card-sim, for a container started with `--entrypoint card-sim`.
# Both listen on 127.0.0.1 by default, which is unreachable from outside the container: set
# PAYMENTS__SERVER__BIND=0.0.0.0:8080 or CARD_SIM_BIND=0.0.0.0:9090 (docker-compose.yml does).
# Both handle SIGTERM (docker stop) by draining the requests in flight.
EXPOSE 8080 9090
ENTRYPOINT ["payments-api"]
