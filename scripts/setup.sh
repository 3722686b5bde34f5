#!/usr/bin/env bash
# Idempotent set-up on Debian 12 (as root): system packages, a virtualenv at .venv/, and pyzmq built
# against Debian's libzmq so that epgm:// and norm:// work (the PyPI wheel has neither).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
PY="$VENV/bin/python"

log() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# --- system packages ---------------------------------------------------------------------------------
mapfile -t wanted < <(grep -vE '^\s*(#|$)' scripts/apt-packages.txt)
missing=()
for pkg in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || die "missing system packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}"
  log "installing system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- virtualenv --------------------------------------------------------------------------------------
if [ ! -x "$PY" ]; then
  log "creating virtualenv $VENV"
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "Python >= 3.11 is required (python3 is $(python3 --version))"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
fi

# --- pyzmq against the system libzmq ------------------------------------------------------------------
has_multicast() { "$PY" -c "import zmq, sys; sys.exit(not (zmq.has('pgm') and zmq.has('norm')))" 2>/dev/null; }
if ! has_multicast; then
  log "building pyzmq against Debian's libzmq (PGM + NORM), about 15 s"
  # PYZMQ_NO_BUNDLE: fail instead of silently bundling a libzmq without pgm/norm.
  # --no-cache-dir: a cached wheel may be one that bundled libzmq.
  PYZMQ_NO_BUNDLE=1 "$PY" -m pip install -q --no-cache-dir --force-reinstall --no-binary pyzmq "pyzmq>=26" \
    || die "pyzmq build failed; is libzmq3-dev installed? (apt-get install libzmq3-dev)"
  has_multicast || die "pyzmq was built but zmq.has('pgm')/zmq.has('norm') is False: it did not link Debian's libzmq5. \
Remove $VENV and re-run; check 'ldd \$($PY -c 'import zmq.backend.cython._zmq as m; print(m.__file__)')'."
fi

# --- the project -------------------------------------------------------------------------------------
stamp="$VENV/.installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log "installing zeps-gateway (editable) with the dev, lab, spark and top extras"
  "$PY" -m pip install -q -e '.[dev,lab,spark,top]'
  has_multicast || die "installing the project replaced pyzmq with a build without pgm/norm"
  touch "$stamp"
fi
# --- the Docker engine (netlab's Docker backend) ----------------------------------------------------
# Debian's docker.io is not started by anything on a machine without systemd: start dockerd ourselves.
# Its FORWARD policy DROP does not strand namespace labs: each inserts an ACCEPT rule for its bridge.
DOCKERD_LOG=/var/log/dockerd.log
if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || die "the Docker engine is not running; start it as root: dockerd (or re-run this as root)"
  if ! pgrep -x dockerd >/dev/null; then  # one that is running may still be starting: wait for it below
    log "starting the Docker engine (log: $DOCKERD_LOG)"
    setsid dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || die "the Docker engine did not answer within 30 s; see the end of $DOCKERD_LOG"
fi

log "ready: $("$PY" -c "import zmq; print('pyzmq', zmq.__version__, 'libzmq', zmq.zmq_version(), 'pgm', zmq.has('pgm'), 'norm', zmq.has('norm'))")"
