# Sourced by .ci/run before `make test`: what the feedback tests need besides Python packages.
# - Debian's chromium (the Playwright browser test drives it; no browser download)
# - a private PostgreSQL cluster on 127.0.0.1, password auth, data in $FEEDBACKRL_PG_DIR; exports
#   FEEDBACKRL_TEST_PG_URL for the tests (they skip PostgreSQL cases only when it is unset).
# Idempotent: installs only what is missing, reuses a running cluster. Quiet: one line per service.
# A developer who already has a server can export FEEDBACKRL_TEST_PG_URL and skip the cluster.

_fb_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

_fb_apt_install() {
  local missing=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "ci: installing ${missing[*]} (apt)"
  _fb_root apt-get update -qq >/dev/null
  _fb_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

_fb_postgres() {
  local dir="${FEEDBACKRL_PG_DIR:-/tmp/feedbackrl-ci-pg}" port="${FEEDBACKRL_PG_PORT:-54329}"
  local pwfile="$dir.password" bin as=()
  bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
  # initdb and postgres refuse to run as root: run them as the postgres user
  [ "$(id -u)" -eq 0 ] && as=(runuser -u postgres --)
  if [ ! -s "$dir/PG_VERSION" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(16))' >"$pwfile")
    [ "$(id -u)" -eq 0 ] && chown postgres "$dir" "$pwfile"
    "${as[@]}" "$bin/initdb" -D "$dir" -U postgres --auth=scram-sha-256 --pwfile="$pwfile" --no-sync >/dev/null
  fi
  if ! "${as[@]}" "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    "${as[@]}" "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -s start \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200"
  fi
  local pw
  pw="$(cat "$pwfile")"
  if ! PGPASSWORD="$pw" "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = 'feedbackrl_test'" | grep -q 1; then
    PGPASSWORD="$pw" "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres feedbackrl_test
  fi
  export FEEDBACKRL_TEST_PG_URL="postgresql+psycopg://postgres:$pw@127.0.0.1:$port/feedbackrl_test"
  echo "ci: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data $dir)"
}

_fb_apt_install postgresql chromium
echo "ci: $(/usr/bin/chromium --version 2>/dev/null || echo 'chromium missing')"
if [ -z "${FEEDBACKRL_TEST_PG_URL:-}" ]; then
  _fb_postgres
fi
