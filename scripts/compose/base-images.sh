#!/usr/bin/env bash
# Makes sure the four base images the compose stack builds on are there, building local
# equivalents from Debian's packages for any that cannot be pulled (an air-gapped build, or a
# machine whose network reaches Debian's mirror but no image registry):
#
#   RUNTIME_IMAGE   debian:bookworm-slim         or payments-local/debian:bookworm-slim,
#                   a minimal bookworm made by debootstrap and imported
#   RUST_IMAGE      rust:1.95-slim-bookworm      or payments-local/rust:<channel>-bookworm,
#                   that bookworm with gcc and the toolchain rust-toolchain.toml pins, copied
#                   from this machine's rustup installation (no toolchain is downloaded)
#   POSTGRES_IMAGE  postgres:16                  or payments-local/postgres:15-bookworm,
#                   Debian's PostgreSQL 15 behind an entrypoint that honours POSTGRES_PASSWORD,
#                   POSTGRES_USER, POSTGRES_DB and the data path /var/lib/postgresql/data
#   REDIS_IMAGE     redis:7                      or payments-local/redis:7-bookworm,
#                   Debian's Redis 7, listening on every address with /data as its directory
#
# It prints the variables to export on standard output (everything else goes to standard
# error), so that one line points the Dockerfile and docker-compose.yml at them:
#
#   eval "$(scripts/compose/base-images.sh)"     # then: docker compose up --build -d
#   scripts/compose/base-images.sh --local       # build the local images even if a pull works
#   scripts/compose/base-images.sh --rebuild     # build the local images again
#
# Safe to re-run: an image that is already there is kept. Needs a Docker engine, and as root
# debootstrap (installed from Debian when missing) for the bookworm image. DEBIAN_MIRROR names
# the mirror (default: the first one this machine's apt uses, else deb.debian.org).
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { printf 'base-images: %s\n' "$*" >&2; }
fail() { printf 'base-images.sh: %s\n' "$*" >&2; exit 1; }

mode=pull
for arg in "$@"; do
    case "$arg" in
        --local) mode=local ;;
        --rebuild) mode=rebuild ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) fail "unknown option: $arg (try --help)" ;;
    esac
done

docker info >/dev/null 2>&1 || fail "no Docker engine answers (start dockerd, or check DOCKER_HOST)"

channel=$(sed -nE 's/^channel *= *"([^"]+)".*/\1/p' rust-toolchain.toml)
[ -n "$channel" ] || fail "rust-toolchain.toml names no channel"

LOCAL_DEBIAN=payments-local/debian:bookworm-slim
LOCAL_RUST=payments-local/rust:$channel-bookworm
LOCAL_POSTGRES=payments-local/postgres:15-bookworm
LOCAL_REDIS=payments-local/redis:7-bookworm

have() { docker image inspect "$1" >/dev/null 2>&1; }

# The image the compose files default to if it is here or can be pulled, else "".
pulled() {
    [ "$mode" = pull ] || return 0
    if have "$1" || timeout 120 docker pull -q "$1" >/dev/null 2>&1; then
        echo "$1"
    fi
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Builds a Dockerfile read from standard input, in the context directory $2, as image $1.
build() {
    local image=$1 context=$2
    cat >"$context/Dockerfile"
    say "building $image"
    docker build -t "$image" "$context" >"$work/build.log" 2>&1 ||
        fail "building $image failed: $(tail -n 5 "$work/build.log")"
}

wanted() { [ "$mode" = rebuild ] || ! have "$1"; }

mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
    local uri
    uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        sed -nE 's#^URIs: *(http[^ ]*/debian)/?$#\1#p' | head -n 1)
    [ -n "$uri" ] || uri=$(sed -nE 's#^deb +(http[^ ]*/debian)/? +.*#\1#p' /etc/apt/sources.list 2>/dev/null | head -n 1)
    echo "${uri:-http://deb.debian.org/debian}"
}

debian_image() {
    wanted "$LOCAL_DEBIAN" || return 0
    if ! command -v debootstrap >/dev/null 2>&1; then
        [ "$(id -u)" = 0 ] || fail "debootstrap is missing (apt-get install debootstrap)"
        say "installing debootstrap from Debian"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
            fail "apt-get install debootstrap failed"
    fi
    [ "$(id -u)" = 0 ] || fail "debootstrap needs root to make the bookworm image"
    local root=$work/bookworm source
    source=$(mirror)
    say "debootstrap of bookworm (minbase) from $source"
    debootstrap --variant=minbase bookworm "$root" "$source" >"$work/debootstrap.log" 2>&1 ||
        fail "debootstrap failed: $(tail -n 3 "$work/debootstrap.log")"
    # Slim as the official image is: no package lists, caches or documentation.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/usr/share/doc/* \
        "$root"/usr/share/man/* "$root"/usr/share/locale/*
    say "importing $LOCAL_DEBIAN"
    tar -C "$root" -c . | docker import -c 'CMD ["bash"]' \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$LOCAL_DEBIAN" >/dev/null ||
        fail "docker import of the bookworm tree failed"
}

postgres_image() {
    wanted "$LOCAL_POSTGRES" || return 0
    local context=$work/postgres
    mkdir -p "$context"
    cat >"$context/entrypoint.sh" <<'ENTRYPOINT'
#!/bin/sh
# The official postgres image's contract, for what docker-compose.yml uses: on an empty data
# directory, initdb with POSTGRES_USER/POSTGRES_PASSWORD and create POSTGRES_DB; then run the
# server as the postgres user, as PID 1, listening on every address with password auth.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
bin=/usr/lib/postgresql/15/bin
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    printf '%s' "$POSTGRES_PASSWORD" >/run/postgresql/pwfile
    as_postgres "$bin/initdb" -D "$PGDATA" -U "$user" --pwfile=/run/postgresql/pwfile \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f /run/postgresql/pwfile
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    # Created on the Unix socket alone, so no TCP client sees the server before it is ready.
    as_postgres "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [ "$db" != postgres ]; then
        as_postgres psql -q -U "$user" -d postgres -c "CREATE DATABASE \"$db\""
    fi
    as_postgres "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
    "$bin/postgres" -D "$PGDATA" -c listen_addresses='*'
ENTRYPOINT
    build "$LOCAL_POSTGRES" "$context" <<DOCKERFILE
FROM $LOCAL_DEBIAN
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        postgresql-15 && rm -rf /var/lib/apt/lists/*
ENV PGDATA=/var/lib/postgresql/data PATH=/usr/lib/postgresql/15/bin:\$PATH
COPY entrypoint.sh /usr/local/bin/docker-entrypoint.sh
RUN chmod 755 /usr/local/bin/docker-entrypoint.sh && mkdir -p \$PGDATA \
    && chown -R postgres:postgres /var/lib/postgresql
VOLUME /var/lib/postgresql/data
STOPSIGNAL SIGINT
EXPOSE 5432
ENTRYPOINT ["docker-entrypoint.sh"]
DOCKERFILE
}

redis_image() {
    wanted "$LOCAL_REDIS" || return 0
    local context=$work/redis
    mkdir -p "$context"
    build "$LOCAL_REDIS" "$context" <<DOCKERFILE
FROM $LOCAL_DEBIAN
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        redis-server && rm -rf /var/lib/apt/lists/* && mkdir /data && chown redis:redis /data
USER redis
WORKDIR /data
EXPOSE 6379
# As the official image runs it: every address, no protected mode (the network is the boundary).
CMD ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--dir", "/data"]
DOCKERFILE
}

rust_image() {
    wanted "$LOCAL_RUST" || return 0
    command -v rustup >/dev/null 2>&1 ||
        fail "no rustup here: the Rust image takes the $channel toolchain from this machine's rustup"
    local sysroot context=$work/rust
    # The sysroot of the pinned toolchain (rustc resolves rust-toolchain.toml from here).
    sysroot=$(rustc --print sysroot 2>/dev/null) ||
        fail "the $channel toolchain is not installed here (rustup toolchain install $channel)"
    sysroot=$(readlink -f "$sysroot")
    "$sysroot/bin/rustc" --version | grep -q " $channel " ||
        fail "$sysroot is not the $channel toolchain ($("$sysroot/bin/rustc" --version))"
    mkdir -p "$context/toolchain"
    say "copying the $channel toolchain from $sysroot (without its HTML documentation)"
    tar -C "$sysroot" --exclude=./share/doc/rust/html -c . | tar -C "$context/toolchain" -x
    cp "$(command -v rustup)" "$context/rustup"
    build "$LOCAL_RUST" "$context" <<DOCKERFILE
FROM $LOCAL_DEBIAN
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates gcc libc6-dev && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:\$PATH
COPY toolchain /usr/local/rustup/toolchains/$channel-x86_64-unknown-linux-gnu
COPY rustup /usr/local/cargo/bin/rustup
# rustup's proxies, and the pinned toolchain as the default: nothing is fetched at build time.
RUN cd /usr/local/cargo/bin && for tool in cargo rustc rustdoc cargo-clippy clippy-driver rustfmt; do \
        ln -s rustup "\$tool"; done \
    && printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\nauto_self_update = "disable"\n' \
        "$channel-x86_64-unknown-linux-gnu" >/usr/local/rustup/settings.toml \
    && cargo --version
DOCKERFILE
}

runtime=$(pulled debian:bookworm-slim)
rust=$(pulled rust:1.95-slim-bookworm)
postgres=$(pulled postgres:16)
redis=$(pulled redis:7)
if [ -z "$runtime" ] || [ -z "$rust" ] || [ -z "$postgres" ] || [ -z "$redis" ]; then
    [ "$mode" = pull ] && say "some base images cannot be pulled: building local equivalents from Debian's packages"
    debian_image
fi
[ -n "$runtime" ] || runtime=$LOCAL_DEBIAN
[ -n "$rust" ] || { rust_image; rust=$LOCAL_RUST; }
[ -n "$postgres" ] || { postgres_image; postgres=$LOCAL_POSTGRES; }
[ -n "$redis" ] || { redis_image; redis=$LOCAL_REDIS; }

printf 'export RUNTIME_IMAGE=%s RUST_IMAGE=%s POSTGRES_IMAGE=%s REDIS_IMAGE=%s\n' \
    "$runtime" "$rust" "$postgres" "$redis"
