#!/usr/bin/env bash
# CI: the image, built and run. Builds docker/Dockerfile with podman on a Debian base made by
# debootstrap (CPU torch), starts it, checks /health, runs one experiment on a target mounted
# into it and prints the verdict its API gives (docker/ci_check.py). Run as root (apt-get,
# debootstrap, podman); exits non-zero on any failure.
#   OVERNIGHT_IMAGE_CACHE   where the Debian base's tarball is kept, one a week
#                           (default ~/.cache/overnight/image)
#   OVERNIGHT_DEBIAN_MIRROR the mirror for debootstrap (default: apt's, from /etc/apt/sources*)
#   TORCH_SPEC              the torch the image gets (default torch==2.13.0, the CPU build here)
# pip's cache (`pip cache dir`, ~/.cache/pip) is mounted into the build, so what pip caches is
# reused by the next build (downloads whose responses allow caching, wheels it built); podman's
# layer cache makes a rebuild with unchanged sources take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bookworm
CACHE="${OVERNIGHT_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/overnight/image}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
IMAGE=localhost/overnight:ci
PODMAN=(podman --runtime runc --cgroup-manager=cgroupfs)
LIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

fail() { echo "error: docker/ci.sh: $*" >&2; exit 1; }
step() { echo "== $* ($(( SECONDS - T0 )) s)"; }
T0=$SECONDS

[[ $(id -u) == 0 ]] || fail "run as root (it installs podman and debootstrap, and runs podman)"

# --- podman and debootstrap (Debian's; runc: crun cannot set the rlimits here) -------------
if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null \
   || ! command -v runc >/dev/null; then
  step "installing podman, runc and debootstrap"
  command -v apt-get >/dev/null || fail "no podman, and no apt-get to install it"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends podman runc debootstrap >/dev/null \
    || fail "could not install podman, runc and debootstrap"
fi

# --- the Debian base: debootstrap once a week, imported into podman ------------------------
mirror="${OVERNIGHT_DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then  # the first Debian URI apt uses (deb822 or one-line sources)
  mirror=$({ cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
               /etc/apt/sources.list.d/*.list 2>/dev/null || true; } \
           | sed -n -E 's#^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)([a-z]+://[^[:space:]]*/debian)/?([[:space:]].*)?$#\3#p' \
           | head -1)
fi
[[ -n "$mirror" ]] || fail "no Debian mirror in /etc/apt/sources*; set OVERNIGHT_DEBIAN_MIRROR"
week=$(date -u +%G-W%V)
tarball="$CACHE/debian-$SUITE-minbase-$week.tar"
base="localhost/overnight-base:$SUITE-$week"
mkdir -p "$CACHE"
if [[ ! -s "$tarball" ]]; then
  step "debootstrap --variant=minbase $SUITE from $mirror"
  root=$(mktemp -d /var/tmp/overnight-debootstrap.XXXXXX)
  debootstrap --variant=minbase "$SUITE" "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; rm -rf "$root" "$root.log"; fail "debootstrap failed"; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
  rm -rf "$root" "$root.log"
  find "$CACHE" -name "debian-$SUITE-minbase-*.tar" ! -name "${tarball##*/}" -delete
fi
if ! "${PODMAN[@]}" image exists "$base"; then
  step "podman import $tarball"
  "${PODMAN[@]}" import -q "$tarball" "$base" >/dev/null || fail "podman import failed"
fi

# --- the build: pip reaches this machine's indexes and wheels, its cache mounted -----------
work=$(mktemp -d /tmp/overnight-image-ci.XXXXXX)
container="overnight-ci-$$"
cleanup() {
  if "${PODMAN[@]}" container exists "$container" 2>/dev/null; then
    "${PODMAN[@]}" stop -t 30 "$container" >/dev/null 2>&1 || true
    "${PODMAN[@]}" rm -f "$container" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM  # the EXIT trap cleans up on these too

# The host's pip settings (index, extra indexes, find-links, CA bundle) in a pip.conf for the
# build, and the local files and folders they name mounted read-only. The Dockerfile depends
# on none of them: a plain `docker build` uses pip's defaults.
python3 - "$work/pip.conf" >"$work/pip-mounts" <<'PY'
import os, re, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                        capture_output=True, text=True).stdout
found = {}
for line in listed.splitlines():  # pip lists the environment's values first; they win
    m = re.match(r"^[^.]*\.([\w-]+)='(.*)'$", line)
    if m and m.group(1) in ("index-url", "extra-index-url", "find-links", "cert"):
        found.setdefault(m.group(1), m.group(2))
cert = found.pop("cert", "")
if os.path.isfile(cert):  # the CA bundle pip trusts here (apt's own bundle stays as it is)
    found["cert"] = "/etc/pip-ca.pem"
    print(cert, found["cert"])
with open(sys.argv[1], "w") as f:
    f.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in found.items()))
for key, value in found.items():
    if key == "cert":
        continue
    for item in value.split():
        path = item.removeprefix("file://")
        if path.startswith("/") and os.path.isdir(path):
            # an index's pages link to its files beside it (../../files/...): mount its parent
            path = os.path.dirname(path.rstrip("/")) if key.endswith("index-url") else path
            print(path, path)
PY
mounts=(-v "$work/pip.conf:/etc/pip.conf:ro")
while read -r src dst; do mounts+=(-v "$src:$dst:ro"); done < <(sort -u "$work/pip-mounts")
pip_cache=$(python3 -m pip cache dir 2>/dev/null || echo "$HOME/.cache/pip")
mkdir -p "$pip_cache"
mounts+=(-v "$pip_cache:/root/.cache/pip")

step "podman build ($TORCH_SPEC on $base)"
build_start=$SECONDS
"${PODMAN[@]}" build --network=host "${LIMITS[@]}" "${mounts[@]}" \
  --build-arg BASE="$base" --build-arg TORCH_SPEC="$TORCH_SPEC" --build-arg PIP_CACHE=on \
  -f docker/Dockerfile -t "$IMAGE" . >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log" >&2; fail "podman build failed"; }
build_s=$(( SECONDS - build_start ))
echo "build time: ${build_s} s"
# what earlier builds left: untagged images, and the bases of other weeks
"${PODMAN[@]}" image prune -f >/dev/null || true
"${PODMAN[@]}" images --format '{{.Repository}}:{{.Tag}}' localhost/overnight-base \
  | grep -v -x "$base" | xargs -r "${PODMAN[@]}" rmi >/dev/null 2>&1 || true

# --- the target, mounted into the container; /data and the target belong to its uid 1000 ---
mkdir -p "$work/data/targets"
cp -r docker/ci-target "$work/data/targets/tiny"
git -C "$work/data/targets/tiny" init -q
git -C "$work/data/targets/tiny" add -A
git -C "$work/data/targets/tiny" -c user.name=ci -c user.email=ci@localhost \
  commit -qm "the image check's target"
sed -i 's/^LR = 0.01$/LR = 0.1/' "$work/data/targets/tiny/train.py"
git -C "$work/data/targets/tiny" diff >"$work/lr.diff"
git -C "$work/data/targets/tiny" checkout -q -- train.py
[[ -s "$work/lr.diff" ]] || fail "the experiment's diff is empty (docker/ci-target/train.py changed?)"
chown -R 1000:1000 "$work/data"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OVERNIGHT_TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
export OVERNIGHT_TOKEN
step "podman run on port $port"
"${PODMAN[@]}" run -d --name "$container" --network=host "${LIMITS[@]}" \
  -e OVERNIGHT_TOKEN -v "$work/data:/data" "$IMAGE" --slots 1 --port "$port" >/dev/null \
  || fail "podman run failed"
if ! python3 docker/ci_check.py "http://127.0.0.1:$port" /data/targets/tiny "$work/lr.diff" \
     "$container"; then
  echo "--- the container's log:" >&2
  "${PODMAN[@]}" logs --tail 60 "$container" >&2 || true
  fail "the image check failed"
fi
step "done: the image built in ${build_s} s and ran one experiment"
