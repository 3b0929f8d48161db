#!/usr/bin/env bash
# Makes sure a PostgreSQL server with the pgvector extension is installed and running on
# this machine, then prints a URL the test suite can use (a superuser on 127.0.0.1; the
# tests create and drop their own schemas and databases). Called by .ci/run; safe to run
# again. Everything except the URL goes to stderr.
#
# pgvector is not packaged for Debian bookworm, so it is built from Debian's own source
# package of the next release (trixie) against the installed server's pg_config.
set -euo pipefail

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "not root and no sudo: cannot install PostgreSQL"
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive

# 1. The server ---------------------------------------------------------------------------
if ! command -v pg_lsclusters >/dev/null || [ -z "$(ls /usr/lib/postgresql 2>/dev/null)" ]; then
    log "installing PostgreSQL (apt-get install postgresql)"
    $SUDO apt-get update -q >&2
    $SUDO apt-get install -y -q postgresql >&2
fi
PG_VERSION="$(ls /usr/lib/postgresql | sort -n | tail -n 1)"
PG_BIN="/usr/lib/postgresql/$PG_VERSION/bin"
[ -x "$PG_BIN/postgres" ] || die "no server binary in $PG_BIN"
if ! pg_lsclusters -h | awk -v v="$PG_VERSION" '$1 == v' | grep -q .; then
    log "creating cluster $PG_VERSION/main"
    $SUDO pg_createcluster "$PG_VERSION" main >&2
fi
CLUSTER="$(pg_lsclusters -h | awk -v v="$PG_VERSION" '$1 == v {print $2; exit}')"
PORT="$(pg_lsclusters -h | awk -v v="$PG_VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {print $3}')"
if ! pg_lsclusters -h | awk -v v="$PG_VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {print $4}' \
    | grep -q online; then
    log "starting cluster $PG_VERSION/$CLUSTER"
    $SUDO pg_ctlcluster --skip-systemctl-redirect "$PG_VERSION" "$CLUSTER" start >&2
fi
for _ in $(seq 1 30); do
    "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" && break
    sleep 1
done
"$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" || die "PostgreSQL does not answer on port $PORT"

as_postgres() { $SUDO runuser -u postgres -- "$@"; }
admin_sql() { as_postgres "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -p "$PORT" -d postgres "$@"; }

# 2. pgvector -----------------------------------------------------------------------------
has_vector() {
    [ "$(admin_sql -tAc "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")" = 1 ]
}
if ! has_vector; then
    log "building pgvector from Debian's trixie source package"
    # Reuse the mirror apt already uses for Debian itself.
    MIRROR="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -vE '^[[:space:]]*#' \
        | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n 1 | tr -d ' ' || true)"
    [ -n "$MIRROR" ] || MIRROR="http://deb.debian.org/debian"
    SRC_LIST=/etc/apt/sources.list.d/stratamem-pgvector-src.sources
    BUILD_DIR="$(mktemp -d)"
    cleanup() {
        $SUDO rm -f "$SRC_LIST"
        rm -rf "$BUILD_DIR"
    }
    trap cleanup EXIT
    printf 'Types: deb-src\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: %s\n' \
        "$MIRROR" /usr/share/keyrings/debian-archive-keyring.gpg | $SUDO tee "$SRC_LIST" >/dev/null
    $SUDO apt-get update -q >&2
    $SUDO apt-get install -y -q "postgresql-server-dev-$PG_VERSION" dpkg-dev make gcc >&2
    (
        cd "$BUILD_DIR"
        apt-get source -q pgvector >&2
        cd "$(find . -maxdepth 1 -type d -name 'pgvector-*' | head -n 1)"
        # OPTFLAGS="": no -march=native, so the library runs on any x86-64 this image moves to.
        make -s PG_CONFIG="$PG_BIN/pg_config" OPTFLAGS="" >&2
        $SUDO make -s install PG_CONFIG="$PG_BIN/pg_config" OPTFLAGS="" >&2
    )
    cleanup
    trap - EXIT
    has_vector || die "pgvector was built but CREATE EXTENSION vector is still unavailable"
fi

# 3. A URL for the tests --------------------------------------------------------------------
URL="${STRATAMEM_TEST_POSTGRES_URL:-postgresql://postgres@127.0.0.1:$PORT/postgres}"
if ! "$PG_BIN/psql" -X -q "$URL" -tAc "SELECT 1" >/dev/null 2>&1; then
    # A fresh install asks for a password on TCP: give a dedicated CI role one.
    log "creating role stratamem_ci for password login on 127.0.0.1"
    admin_sql -c "DO \$\$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'stratamem_ci') THEN
            CREATE ROLE stratamem_ci LOGIN SUPERUSER PASSWORD 'stratamem_ci';
        END IF; END \$\$;"
    URL="postgresql://stratamem_ci:stratamem_ci@127.0.0.1:$PORT/postgres"
    "$PG_BIN/psql" -X -q "$URL" -tAc "SELECT 1" >/dev/null || die "cannot log in with $URL"
fi
"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$URL" -c "CREATE EXTENSION IF NOT EXISTS vector" >&2 \
    || die "CREATE EXTENSION vector failed"
log "PostgreSQL $PG_VERSION with pgvector $("$PG_BIN/psql" -X "$URL" -tAc \
    "SELECT extversion FROM pg_extension WHERE extname = 'vector'") on port $PORT"
printf '%s\n' "$URL"
