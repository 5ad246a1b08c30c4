#!/usr/bin/env bash
# `make compose-setup`: a Docker engine, the compose v2 plugin and the three images the compose file
# names, on a machine that may have none of them and no image registry.
#
#   engine   `docker info` answers -> nothing; else install Debian's docker.io (root or sudo) and
#            start dockerd (systemd when it runs, else in the background, log in $XDC_DOCKERD_LOG).
#   plugin   `docker compose version` answers -> nothing; else build the pinned compose v2 from the
#            Go module proxy into ~/.docker/cli-plugins/docker-compose.
#   images   the pinned upstream images (python slim, docker CLI, Toxiproxy) when present or
#            pullable -> nothing to build. Otherwise, from this machine's own packages:
#              xdc-base:<content hash>   Debian bookworm (mmdebstrap) + the host venv's Python + a
#                                        venv at /opt/venv holding the host venv's site-packages
#                                        (torch and the rest, the very builds the native runs use)
#                                        + the docker CLI; it stands in for both the python base and
#                                        the docker CLI image.
#              xdc-toxiproxy:<version>-local   the pinned Toxiproxy server and CLI, built static.
#            The hash covers the Debian suite and packages, the host's Python build, the host venv's
#            distributions, the recipe's version and the docker CLI's, so an unchanged setup reuses
#            the image and any change builds a new one (older local bases are then removed).
#   .env     compose/.env names the images chosen (XDC_BASE_IMAGE, XDC_DOCKER_CLI_IMAGE,
#            XDC_TOXIPROXY_IMAGE), the runs directory the services bind (XDC_RUNS_DIR, ./runs) and
#            their user (XDC_UID); `docker compose` run in compose/ reads it, the Makefile exports it.
#
# Idempotent; on a normal Docker host with registry access it installs and builds nothing. Run from
# the repository root. Environment (defaults in brackets):
#   XDC_VENV [.venv]  XDC_LOCAL_IMAGES [auto | always | never]  XDC_COMPOSE_VERSION [v2.29.7]
#   TOXIPROXY_VERSION [v2.12.0]  XDC_PULL_TIMEOUT_S [30]  XDC_DEBIAN_SUITE [bookworm]
set -euo pipefail

UPSTREAM_BASE_IMAGE=${UPSTREAM_BASE_IMAGE:-python:3.11.11-slim-bookworm}
UPSTREAM_DOCKER_CLI_IMAGE=${UPSTREAM_DOCKER_CLI_IMAGE:-docker:27.5.1-cli}
UPSTREAM_TOXIPROXY_IMAGE=${UPSTREAM_TOXIPROXY_IMAGE:-ghcr.io/shopify/toxiproxy:2.12.0}
XDC_VENV=${XDC_VENV:-.venv}
XDC_LOCAL_IMAGES=${XDC_LOCAL_IMAGES:-auto}
XDC_COMPOSE_VERSION=${XDC_COMPOSE_VERSION:-v2.29.7}
TOXIPROXY_VERSION=${TOXIPROXY_VERSION:-v2.12.0}
XDC_PULL_TIMEOUT_S=${XDC_PULL_TIMEOUT_S:-30}
XDC_DEBIAN_SUITE=${XDC_DEBIAN_SUITE:-bookworm}
XDC_DOCKERD_LOG=${XDC_DOCKERD_LOG:-/var/log/xdc-dockerd.log}
ENV_FILE=compose/.env
# Packages of the local base: Python 3.11 (bookworm's), venv, CA bundle, useradd (passwd).
BASE_PACKAGES=python3,python3-venv,ca-certificates,passwd
# What of the host venv's site-packages no container needs: triton (torch.compile only), the browser
# driver of the report test, and the editable install of this checkout (the image installs the
# project itself). Byte code is kept: the same CPython minor version, and it saves each container a
# recompile of torch's modules.
SITE_EXCLUDES=(./triton './triton-*' ./playwright './playwright-*' './__editable__*' './xdc-*')
# Bump when build_base changes in a way the inputs hashed in base_hash do not show.
BASE_RECIPE=2
LABEL=org.xdc.project=xdc

say() { echo "compose-setup: $*"; }
die() { echo "compose-setup: error: $*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else die "need root (or sudo) to run: $*"; fi
}

# ---- the engine ----------------------------------------------------------------------------------
engine_up() { timeout 20 docker info >/dev/null 2>&1; }

ensure_engine() {
  if engine_up; then return; fi
  if ! command -v dockerd >/dev/null 2>&1; then
    say "no Docker engine answers and dockerd is not installed: installing Debian's docker.io"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  fi
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    say "starting docker with systemd"
    as_root systemctl start docker || true
  fi
  if ! engine_up; then
    if pgrep -x dockerd >/dev/null 2>&1; then
      say "dockerd is running but does not answer yet; waiting"
    else
      say "starting dockerd in the background (log: $XDC_DOCKERD_LOG)"
      # setsid: the daemon outlives this make run and is not in its process group.
      as_root sh -c "setsid nohup dockerd >>'$XDC_DOCKERD_LOG' 2>&1 </dev/null &"
    fi
  fi
  for _ in $(seq 1 60); do engine_up && break; sleep 1; done
  engine_up || die "the Docker engine did not start within 60 s; see $XDC_DOCKERD_LOG (or journalctl -u docker)"
  say "engine: $(docker version --format '{{.Server.Version}}' 2>/dev/null)"
}

# ---- the compose plugin --------------------------------------------------------------------------
ensure_compose() {
  if docker compose version >/dev/null 2>&1; then return; fi
  command -v go >/dev/null 2>&1 || die "docker compose is missing and Go (>= 1.22) is not installed to build it; install the compose plugin (docker-compose-plugin) or Go"
  say "building the compose plugin $XDC_COMPOSE_VERSION with Go (about a minute on an idle machine)"
  local tmp dest=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
  tmp=$(mktemp -d)
  GOBIN=$tmp go install \
    -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$XDC_COMPOSE_VERSION" \
    "github.com/docker/compose/v2/cmd@$XDC_COMPOSE_VERSION"
  mkdir -p "$dest"
  mv "$tmp/cmd" "$dest/docker-compose"
  rmdir "$tmp"
  docker compose version >/dev/null || die "built $dest/docker-compose but \`docker compose version\` still fails"
  say "$(docker compose version)"
}

# ---- images ----------------------------------------------------------------------------------------
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# Present, or pulled within the timeout (a machine without a registry fails fast on DNS).
available() {
  have_image "$1" && return 0
  [ "$XDC_LOCAL_IMAGES" = always ] && return 1
  timeout "$XDC_PULL_TIMEOUT_S" docker pull -q "$1" >/dev/null 2>&1
}

host_python() {  # what of the host venv's Python the base copies: "<purelib> <base prefix> <X.Y>"
  [ -x "$XDC_VENV/bin/python" ] || die "$XDC_VENV/bin/python not found: run \`make setup\` first"
  "$XDC_VENV/bin/python" -c 'import sys, sysconfig; print(sysconfig.get_paths()["purelib"], sys.base_prefix, "%d.%d" % sys.version_info[:2])'
}

# What the local base is made of: a change here builds a new base, an unchanged one is reused.
base_hash() {
  local sp=$1 home=$2
  {
    echo "$XDC_DEBIAN_SUITE $BASE_PACKAGES $home"
    "$XDC_VENV/bin/python" -c 'import sys; print(sys.version)'
    (cd "$sp" && ls -d ./*.dist-info | LC_ALL=C sort)
    echo "recipe $BASE_RECIPE excludes ${SITE_EXCLUDES[*]}"
    docker version --format '{{.Client.Version}}' 2>/dev/null  # the CLI copied into the base
  } | sha256sum | cut -c1-16
}

# The venv's Python is the host venv's own: the sites train on the Python standard library's
# sources (site_agent/data.py), so the same interpreter build means the same corpus, the same
# dataset_id and the same sample ids as a native run. A Debian /usr Python is bookworm's python3;
# any other (pyenv, /usr/local) is copied to /opt/xdc-python, less its site-packages and tests.
build_base() {
  local tag=$1 sp=$2 home=$3 ver=$4 cli python=python3 libpath=""
  command -v mmdebstrap >/dev/null 2>&1 || {
    say "installing mmdebstrap (to build the base image from Debian's packages)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null; }
  cli=$(readlink -f "$(command -v docker)")
  say "building $tag: Debian $XDC_DEBIAN_SUITE + Python $home + $sp + $cli (no registry needed)"
  local t0=$SECONDS hooks=()
  if [ "$home" != /usr ]; then
    python=/opt/xdc-python/bin/python$ver
    libpath=/opt/xdc-python/lib
    hooks+=(--customize-hook="mkdir -p \"\$1/opt/xdc-python\" && tar -C '$home' --exclude='./lib/python$ver/site-packages/*' \
      --exclude='./lib/python$ver/test' -cf - . | tar -C \"\$1/opt/xdc-python\" -xf -")
  fi
  local excludes="" e
  for e in "${SITE_EXCLUDES[@]}"; do excludes+=" --exclude='$e'"; done
  hooks+=(--customize-hook="chroot \"\$1\" env LD_LIBRARY_PATH=$libpath $python -m venv --without-pip /opt/venv"
    --customize-hook="tar -C '$sp'$excludes -cf - . | tar -C \"\$1/opt/venv/lib/python$ver/site-packages\" -xf -"
    --customize-hook="install -m 0755 '$cli' \"\$1/usr/local/bin/docker\"")
  as_root mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" "${hooks[@]}" "$XDC_DEBIAN_SUITE" - \
  | docker import \
      --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      ${libpath:+--change "ENV LD_LIBRARY_PATH=$libpath"} \
      --change 'ENV LANG=C.UTF-8' --change "LABEL $LABEL" --change 'CMD ["python"]' \
      - "$tag" >/dev/null
  say "built $tag in $((SECONDS - t0)) s ($(docker image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.1f GB", $1/1e9}'))"
}

build_toxiproxy() {
  local tag=$1 tmp
  command -v go >/dev/null 2>&1 || die "cannot build $tag: Go is not installed"
  say "building $tag from the Toxiproxy sources ($TOXIPROXY_VERSION, static)"
  tmp=$(mktemp -d)
  mkdir "$tmp/bin"
  CGO_ENABLED=0 GOBIN=$tmp/bin go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" \
    "github.com/Shopify/toxiproxy/v2/cmd/cli@$TOXIPROXY_VERSION"
  # The upstream image's layout: /toxiproxy (the entrypoint) and /toxiproxy-cli (its health check).
  mkdir "$tmp/root"
  mv "$tmp/bin/server" "$tmp/root/toxiproxy"
  mv "$tmp/bin/cli" "$tmp/root/toxiproxy-cli"
  tar -C "$tmp/root" -cf - . | docker import --change 'ENTRYPOINT ["/toxiproxy"]' --change 'EXPOSE 8474' \
    --change "LABEL $LABEL" - "$tag" >/dev/null
  rm -rf "$tmp"
}

# Older local bases (another hash) only hold disk space (5 GB each) once a new one exists. The build
# cache still holds an old base's layers after its tag is gone, so unused build cache goes too.
drop_old_bases() {
  local keep=$1 old dropped=no
  for old in $(docker image ls --filter "label=$LABEL" --format '{{.Repository}}:{{.Tag}}' xdc-base); do
    if [ "$old" != "$keep" ] && docker image rm "$old" >/dev/null 2>&1; then
      say "removed the previous local base $old"
      dropped=yes
    fi
  done
  if [ "$dropped" = yes ]; then docker builder prune -f >/dev/null 2>&1 || true; fi
}

ensure_images() {
  local base=$UPSTREAM_BASE_IMAGE cli_image=$UPSTREAM_DOCKER_CLI_IMAGE toxi=$UPSTREAM_TOXIPROXY_IMAGE
  local local_base=no
  if [ "$XDC_LOCAL_IMAGES" = never ]; then :
  else
    if [ -f "$ENV_FILE" ] && grep -q '^XDC_BASE_IMAGE=xdc-base:' "$ENV_FILE"; then
      local_base=yes  # chosen before: the registry was unreachable; do not wait for it again
    elif ! { available "$base" && available "$cli_image"; }; then
      local_base=yes
    fi
    if [ "$local_base" = yes ]; then
      local sp home ver
      read -r sp home ver < <(host_python)
      base="xdc-base:$(base_hash "$sp" "$home")"
      cli_image=$base
      have_image "$base" || build_base "$base" "$sp" "$home" "$ver"
      drop_old_bases "$base"
    fi
    if [ -f "$ENV_FILE" ] && grep -q '^XDC_TOXIPROXY_IMAGE=xdc-toxiproxy:' "$ENV_FILE" || ! available "$toxi"; then
      toxi="xdc-toxiproxy:${TOXIPROXY_VERSION#v}-local"
      have_image "$toxi" || build_toxiproxy "$toxi"
    fi
  fi
  # The runs directory the services bind (the host's ./runs: logs and report open from here) and the
  # user they run as, who must be able to write there: the caller, but never root (a root process in
  # a container is root on every file it can reach): root's runs directory is handed to the image's
  # own user instead.
  local uid
  uid=$(id -u)
  [ "$uid" != 0 ] || uid=10001
  mkdir -p runs
  [ "$(id -u)" != 0 ] || chown "$uid" runs
  local new
  new=$(printf '%s\n' "# Written by compose/setup.sh (make compose-setup): the images this machine uses," \
    "# the runs directory the services bind and the user they run as." \
    "XDC_BASE_IMAGE=$base" "XDC_DOCKER_CLI_IMAGE=$cli_image" "XDC_TOXIPROXY_IMAGE=$toxi" \
    "XDC_RUNS_DIR=$PWD/runs" "XDC_UID=$uid")
  if [ "$(cat "$ENV_FILE" 2>/dev/null)" != "$new" ]; then
    echo "$new" > "$ENV_FILE"
    say "images: base $base, docker CLI $cli_image, toxiproxy $toxi; runs in $PWD/runs as uid $uid (in $ENV_FILE)"
  fi
}

ensure_engine
ensure_compose
ensure_images
