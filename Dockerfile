# Images of the payments service, in four stages:
#
#   builder       compiles payments-api and card-sim (release) with the pinned toolchain, and
#                 the black-box test binary of crates/api/tests/e2e.rs in the same cargo run.
#   runtime-base  Debian slim with the CA bundle and curl.
#   e2e           runtime-base with the e2e test binary; it runs against a running service
#                 (E2E_BASE_URL).
#   runtime       runtime-base with only the two service binaries, run as a non-root user. It
#                 is the last stage, so a plain `docker build .` produces it.
#
#   docker build -t payments-service:local .                    # the runtime image
#   docker build --target e2e -t payments-service-e2e:local .   # the e2e test runner
#
# docker-compose.yml builds both and wires them to PostgreSQL, Redis and each other. Works with
# BuildKit and with the classic builder (Compose v1's default); neither needs a registry beyond
# the two base images, which are build arguments so that local ones can stand in for them
# (scripts/compose/base-images.sh builds them from Debian's packages):
#
#   RUST_IMAGE       the builder's base: a Rust toolchain on bookworm
#   RUNTIME_IMAGE    the runtime's base: the same Debian release, slim
#   EXTRA_CA_CERTS   PEM certificates the builder trusts besides its own (for cargo behind a
#                    proxy that re-signs TLS); default none. Only the builder has them: the
#                    runtime image starts from RUNTIME_IMAGE and copies nothing but binaries.
ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------------------------------------
FROM ${RUST_IMAGE} AS builder
WORKDIR /src

ARG EXTRA_CA_CERTS=""
RUN if [ -n "$EXTRA_CA_CERTS" ]; then \
        printf '%s\n' "$EXTRA_CA_CERTS" >>/etc/ssl/certs/ca-certificates.crt; \
    fi

# rust-toolchain.toml pins an exact toolchain. If the image's is another 1.95 point release,
# the first cargo call makes rustup fetch the pinned one: here, in a layer of its own that is
# reused until the file changes, instead of after every source change. An image that already
# has it (the official 1.95.0, or base-images.sh's copy of this machine's) fetches nothing.
COPY rust-toolchain.toml ./
RUN cargo --version

# The dependencies, in a layer of their own that only Cargo.toml and Cargo.lock changes
# rebuild: cargo builds them against empty stand-ins for the workspace's sources (a library,
# and a main for every declared binary, test, example and bench), which are then deleted.
COPY Cargo.toml Cargo.lock ./
COPY crates/domain/Cargo.toml crates/domain/
COPY crates/idempotency/Cargo.toml crates/idempotency/
COPY crates/idempotency-sql/Cargo.toml crates/idempotency-sql/
COPY crates/idempotency-axum/Cargo.toml crates/idempotency-axum/
COPY crates/storage/Cargo.toml crates/storage/
COPY crates/redis/Cargo.toml crates/redis/
COPY crates/card-sim/Cargo.toml crates/card-sim/
COPY crates/client/Cargo.toml crates/client/
COPY crates/webhooks/Cargo.toml crates/webhooks/
COPY crates/api/Cargo.toml crates/api/
COPY examples/orders/Cargo.toml examples/orders/
COPY examples/webhook-receiver/Cargo.toml examples/webhook-receiver/
RUN for manifest in crates/*/Cargo.toml examples/*/Cargo.toml; do \
        crate=${manifest%/Cargo.toml}; \
        mkdir -p "$crate/src" && : >"$crate/src/lib.rs"; \
        awk -v crate="$crate" ' \
            /^\[\[(bin|test|example|bench)\]\]/ { kind = substr($0, 3, length($0) - 4); next } \
            /^\[/ { kind = "" } \
            kind != "" && /^path *=/ { gsub(/.*= *"|".*/, ""); print crate "/" $0 } \
            kind != "" && kind != "bin" && /^name *=/ { gsub(/.*= *"|".*/, ""); \
                dir = kind == "bench" ? "benches" : kind "s"; print crate "/" dir "/" $0 ".rs" } \
        ' "$manifest" | while read -r stub; do \
            mkdir -p "$(dirname "$stub")" && echo 'fn main() {}' >"$stub"; \
        done; \
    done \
    && mkdir -p crates/api/tests && echo 'fn main() {}' >crates/api/tests/e2e.rs \
    && cargo build --release --locked -p payments-api -p payments-card-sim --bins --test e2e \
    && rm -rf crates examples

# The workspace itself (examples/ holds a member of it). migrations/ is read at compile time: sqlx::migrate!() embeds the SQL
# files into the binary, so the runtime image needs no migrations directory. The sources are
# touched so that cargo rebuilds every workspace crate over the stand-ins' artifacts, whatever
# the files' dates in the build context.
COPY crates ./crates
COPY examples ./examples
COPY migrations ./migrations
# Served at GET /openapi.yaml and GET /problems/{code}, embedded when the service is built.
COPY openapi.yaml ./
COPY docs/errors.md docs/
# --locked: build exactly the versions in Cargo.lock, and fail instead of updating it. The
# e2e test binary is copied to a fixed path for the e2e stage.
RUN find crates examples -name '*.rs' -exec touch {} + \
    && cargo build --release --locked -p payments-api -p payments-card-sim --bins --test e2e \
        --message-format=json-render-diagnostics >/tmp/build.json \
    && e2e=$(grep '"name":"e2e"' /tmp/build.json | grep -o '"executable":"[^"]*"' | cut -d'"' -f4) \
    && test -x "$e2e" && cp "$e2e" target/release/e2e && rm /tmp/build.json

# ---------------------------------------------------------------------------------------------
# Same Debian release as the builder image (bookworm), so the binaries find the glibc they
# were linked against. TLS is rustls (no OpenSSL), so the only library-like need is the CA
# bundle for outgoing HTTPS; curl is there for the compose healthchecks. The e2e image is this
# base with the test binary; the runtime image, the service binaries.
FROM ${RUNTIME_IMAGE} AS runtime-base
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------------------------------------
# The black-box end-to-end tests, run from their own container against the composed stack
# (docker compose --profile e2e run --rm e2e). The binary reads the service's URL from
# E2E_BASE_URL, which docker-compose.yml sets (http://payments-api:8080); the image sets no
# default, as the right address depends on where the service runs.
FROM runtime-base AS e2e
COPY --from=builder /src/target/release/e2e /usr/local/bin/payments-e2e
CMD ["payments-e2e"]

# ---------------------------------------------------------------------------------------------
FROM runtime-base AS runtime
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
