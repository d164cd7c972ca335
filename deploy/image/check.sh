#!/usr/bin/env bash
# Builds the repository's Dockerfile into the image idemd:ci and checks that image as a
# container would run it: as the image's user, on its ENTRYPOINT and CMD, with its
# HEALTHCHECK, on a /data that the user can write and that survives a restart, and with
# /idemctl working against the daemon.
#
# No registry of images is reachable from CI, and no OCI runtime can start a container
# there (it has no cgroups or rlimits to hand out), so:
#   - the Dockerfile's two bases are stand-ins made on this machine (make_go_standin,
#     make_static_standin), stored under the bases' own names so that
#     `podman build --pull=never` takes them. The real bases are the ones released images
#     are built on; what they add over the stand-ins is said at each;
#   - podman builds with --isolation chroot, which needs no runtime;
#   - the built image's files are copied out, and its commands run under chroot(1) as the
#     image's user, in a network namespace whose only interface is its own loopback: the
#     image's fixed port is free there, and nothing else can answer on it.
#
# Run as root from anywhere: bash deploy/image/check.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script="$here/$(basename "$0")"
cd "$here/../.."

image=idemd:ci
# The Dockerfile's bases, as it names them, and the names podman looks the first up by.
go_base=golang:1.26-bookworm
go_base_stored=docker.io/library/golang:1.26-bookworm
static_base=gcr.io/distroless/static-debian12:nonroot
# The Helm chart runs the image as this user and group (runAsUser, runAsGroup, fsGroup).
nonroot=65532

fail() {
  if [ -s "${work:-}/idemd.log" ]; then
    echo "idemd's log, to its end:" >&2
    tail -n 20 "$work/idemd.log" >&2
  fi
  echo "image check: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || fail "run as root: podman stores images for root, and chroot(1) needs it"
command -v go >/dev/null || fail "no go on the PATH: the Go stand-in is made from the machine's toolchain"

missing=()
command -v podman >/dev/null || missing+=(podman)
command -v buildah >/dev/null || missing+=(buildah)
# The Go stand-in's /bin/sh for the Dockerfile's RUN lines: a static busybox runs in any root.
[ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" = "install ok installed" ] || missing+=(busybox-static)
[ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
command -v ip >/dev/null || missing+=(iproute2)
command -v curl >/dev/null || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# One run at a time: runs share the stand-ins, the image's name and Go's build cache.
cache="${XDG_CACHE_HOME:-$HOME/.cache}/idemd-ci"
mkdir -p "$cache"
exec 9>"$cache/image.lock"
flock 9

bases=$(awk 'toupper($1) == "FROM" { print $2 }' Dockerfile | sort -u)
[ "$bases" = "$(printf '%s\n' "$go_base" "$static_base" | sort -u)" ] ||
  fail "the Dockerfile's bases are now $(echo $bases); $script makes stand-ins for $go_base and $static_base only"

work=$(mktemp -d /tmp/idemd-image.XXXXXX)
standin=""
image_mounted=""
netns=""
daemon_pid=""
cleanup() {
  set +e
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill "$daemon_pid"
    wait "$daemon_pid" 2>/dev/null || true
  fi
  [ -z "$netns" ] || ip netns delete "$netns"
  [ -z "$image_mounted" ] || podman image unmount "$image" >/dev/null
  [ -z "$standin" ] || buildah rm "$standin" >/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# A stand-in is kept while the label it was made with matches what it would be made
# from now, so that a new Go, proxy setting or version of this script makes it anew.
recipe() {
  { sha256sum <"$script"; printf '%s\n' "$@"; } | sha256sum | cut -c1-16
}
is_current() { # name recipe
  [ "$(podman image inspect --format '{{index .Labels "idemd.stand-in"}}' "$1" 2>/dev/null)" = "$2" ]
}
commit_standin() { # name
  buildah commit --rm -q "$standin" "$1" >/dev/null
  standin=""
}

# The stand-in for golang:1.26-bookworm: the machine's own Go toolchain in /usr/local/go,
# a static busybox for /bin/sh and the commands RUN lines call, the machine's CA
# certificates for the module proxy, and the machine's GOPROXY, GOSUMDB and GOFLAGS
# (those of its go env file, not of this shell). The real image adds Debian 12 itself:
# bash, git, gcc and libc for cgo, and the rest of a Debian system.
goroot=$(readlink -f "$(go env GOROOT)")
go_settings=()
for name in GOPROXY GOSUMDB GOFLAGS; do
  value=$(env -u "$name" go env "$name")
  [ -z "$value" ] || go_settings+=(--env "$name=$value")
done
go_recipe=$(recipe "$(go version)" "$goroot" "${go_settings[@]}" "$(sha256sum /bin/busybox /etc/ssl/certs/ca-certificates.crt)")
make_go_standin() {
  standin=$(buildah from scratch)
  local root
  root=$(buildah mount "$standin")
  mkdir -p "$root"/{bin,etc/ssl/certs,go/bin,go/src,root,tmp,usr/local/go}
  chmod 1777 "$root/tmp"
  chmod 700 "$root/root"
  cp -a "$goroot/." "$root/usr/local/go/"
  cp /bin/busybox "$root/bin/busybox"
  local applet
  for applet in $(/bin/busybox --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
  done
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group"
  echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
  buildah unmount "$standin" >/dev/null
  buildah config --env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env GOPATH=/go --env GOTOOLCHAIN=local "${go_settings[@]}" --workingdir /go --cmd /bin/sh \
    --label "idemd.stand-in=$go_recipe" "$standin"
  commit_standin "$go_base_stored"
}

# The stand-in for gcr.io/distroless/static-debian12:nonroot: /etc/passwd and /etc/group
# with root, nobody and nonroot (65532), which the Dockerfile's --chown and USER name;
# the CA certificates; /tmp (1777) and nonroot's home; its user, working directory and
# environment. The real image adds tzdata, /etc/os-release, netbase's /etc/services and
# /etc/protocols and the packages' licences, and is a versioned, signed Debian 12 base.
static_recipe=$(recipe "$(sha256sum /etc/ssl/certs/ca-certificates.crt)")
make_static_standin() {
  standin=$(buildah from scratch)
  local root
  root=$(buildah mount "$standin")
  mkdir -p "$root"/{etc/ssl/certs,home/nonroot,root,tmp}
  chmod 1777 "$root/tmp"
  chmod 700 "$root/root" "$root/home/nonroot"
  chown "$nonroot:$nonroot" "$root/home/nonroot"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    "nonroot:x:$nonroot:$nonroot:nonroot:/home/nonroot:/sbin/nologin" >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'tty:x:5:' 'staff:x:50:' "nonroot:x:$nonroot:" >"$root/etc/group"
  echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  buildah unmount "$standin" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --user "$nonroot" --workingdir /home/nonroot \
    --label "idemd.stand-in=$static_recipe" "$standin"
  commit_standin "$static_base"
}

if ! is_current "$go_base_stored" "$go_recipe"; then
  echo "making the stand-in for $go_base from $(go version | cut -d' ' -f3) in $goroot"
  make_go_standin
fi
if ! is_current "$static_base" "$static_recipe"; then
  echo "making the stand-in for $static_base"
  make_static_standin
fi
is_current "$go_base" "$go_recipe" || fail "podman does not find the stand-in for $go_base under that name"
case "$go_base" in
*":$(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')-"*) ;;
*) echo "note: the Dockerfile builds with $go_base, the stand-in has $(go env GOVERSION)" ;;
esac

# The build. Go's module and build caches come from the machine, mounted where the Go
# image keeps them, so that a run downloads and compiles only what changed; the RUN lines
# still run every time (--layers=false), so the project is always built anew. The docker
# format keeps HEALTHCHECK, which the OCI format has no field for.
gomodcache=$(go env GOMODCACHE)
gocache="$cache/image-go-build"
mkdir -p "$gomodcache" "$gocache"
version="image-check-$(git describe --tags --always 2>/dev/null || echo unknown)"
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
build_started=$SECONDS
if ! podman build --isolation chroot --pull=never --layers=false --format docker \
  --volume "$gomodcache:/go/pkg/mod" --volume "$gocache:/root/.cache/go-build" \
  --build-arg "VERSION=$version" --build-arg "COMMIT=$commit" -t "$image" . >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  fail "podman build failed"
fi
# The images that newer ones replaced, the stand-ins' and idemd:ci's, all labelled
# idemd.stand-in (the label goes down to the image), are dropped.
podman images -q --filter dangling=true --filter label=idemd.stand-in | xargs -r podman rmi >/dev/null 2>&1 || true
size=$(podman image inspect --format '{{.Size}}' "$image")
layers=$(podman image inspect --format '{{len .RootFS.Layers}}' "$image")
echo "built $image in $((SECONDS - build_started)) s: $(numfmt --to=iec-i --suffix=B "$size") in $layers layers"

# What a runtime would run, read from the image rather than from the Dockerfile.
# config_list prints a list of the image's one item a line (podman ends with one more).
config_list() { podman image inspect --format "{{range $1}}{{println .}}{{end}}" "$image" | head -n -1; }
mapfile -t entrypoint < <(config_list .Config.Entrypoint)
mapfile -t cmd < <(config_list .Config.Cmd)
mapfile -t environment < <(config_list .Config.Env)
mapfile -t healthcheck < <(config_list .HealthCheck.Test)
mapfile -t ports < <(podman image inspect --format '{{range $port, $_ := .Config.ExposedPorts}}{{println $port}}{{end}}' "$image" | head -n -1)
user=$(podman image inspect --format '{{.Config.User}}' "$image")
[ ${#entrypoint[@]} -gt 0 ] || fail "the image has no ENTRYPOINT"
[ "${healthcheck[0]:-}" = CMD ] && [ ${#healthcheck[@]} -gt 1 ] ||
  fail "the image's HEALTHCHECK is '${healthcheck[*]:-none}'; it must be an exec form (CMD [...]): the image has no shell"
[ ${#ports[@]} = 1 ] && [ "${ports[0]%/tcp}" != "${ports[0]}" ] ||
  fail "the image exposes '${ports[*]:-nothing}'; the check expects one TCP port"
base="http://127.0.0.1:${ports[0]%/tcp}"

# The image's files, in a root of our own: the daemon writes to its /data.
rootfs="$work/rootfs"
mkdir "$rootfs"
image_root=$(podman image mount "$image")
image_mounted=yes
cp -a "$image_root/." "$rootfs/"
podman image unmount "$image" >/dev/null
image_mounted=""
chmod 755 "$rootfs"

# The user, named as in the image, is looked up in the image's own /etc/passwd and /etc/group.
lookup_id() { # file name
  case "$2" in
  '' | *[!0-9]*) awk -F: -v name="$2" '$1 == name { print $3; found = 1 } END { exit !found }' "$1" ;;
  *) echo "$2" ;;
  esac
}
[ -n "$user" ] || fail "the image has no USER: it would run as root"
uid=$(lookup_id "$rootfs/etc/passwd" "${user%%:*}") || fail "user ${user%%:*} is not in the image's /etc/passwd"
if [ "${user#*:}" != "$user" ]; then
  gid=$(lookup_id "$rootfs/etc/group" "${user#*:}") || fail "group ${user#*:} is not in the image's /etc/group"
else
  gid=$(awk -F: -v uid="$uid" '$3 == uid { print $4 }' "$rootfs/etc/passwd")
fi
[ "$uid:$gid" = "$nonroot:$nonroot" ] || fail "the image runs as $user ($uid:$gid); the Helm chart runs it as $nonroot:$nonroot"
[ "$(stat -c %u:%g "$rootfs/data")" = "$uid:$gid" ] ||
  fail "/data belongs to $(stat -c %u:%g "$rootfs/data"), not to the image's user $uid:$gid"

netns="idemd-image-$$"
ip netns add "$netns"
ip -n "$netns" link set lo up
chroot_bin=$(command -v chroot)
# A command of the image's, as its user, with its environment, in the namespace: each
# of these programs execs the next, so a command started in the background has $! for PID.
in_image=(ip netns exec "$netns" env -i "${environment[@]}" "$chroot_bin" --userspec="$uid:$gid" "$rootfs")
in_netns() { ip netns exec "$netns" "$@"; }

start_daemon() {
  "${in_image[@]}" "${entrypoint[@]}" "${cmd[@]}" >>"$work/idemd.log" 2>&1 &
  daemon_pid=$!
  local deadline=$((SECONDS + 30))
  until in_netns curl -fsS -o /dev/null "$base/healthz" 2>/dev/null; do
    if ! kill -0 "$daemon_pid" 2>/dev/null; then
      cat "$work/idemd.log" >&2
      fail "'${entrypoint[*]} ${cmd[*]}' exited at start-up"
    fi
    [ $SECONDS -lt $deadline ] || fail "no answer on $base/healthz within 30 s"
    sleep 0.1
  done
  local ids
  ids=$(awk '/^Uid:/ { print $2, $3, $4, $5 }' "/proc/$daemon_pid/status")
  [ "$ids" = "$uid $uid $uid $uid" ] || fail "idemd runs as uids $ids, not $uid"
}
stop_daemon() {
  kill -TERM "$daemon_pid"
  local deadline=$((SECONDS + 30)) status=0
  while kill -0 "$daemon_pid" 2>/dev/null && [ "$(awk '{ print $3 }' "/proc/$daemon_pid/stat" 2>/dev/null)" != Z ]; do
    [ $SECONDS -lt $deadline ] || fail "idemd did not stop within 30 s of SIGTERM"
    sleep 0.1
  done
  wait "$daemon_pid" || status=$?
  daemon_pid=""
  [ $status = 0 ] || {
    cat "$work/idemd.log" >&2
    fail "idemd exited with $status on SIGTERM"
  }
}
# post PATH JSON prints the status; the body is left in $work/body.
post() {
  in_netns curl -sS -o "$work/body" -w '%{http_code}' -XPOST "$base$1" -H 'Content-Type: application/json' -d "$2"
}
expect() { # what status wanted-status [pattern in body]
  [ "$2" = "$3" ] || fail "$1 answered $2, not $3: $(cat "$work/body")"
  [ -z "${4:-}" ] || grep -q "$4" "$work/body" || fail "$1 answered without $4: $(cat "$work/body")"
}

key=image-check
claim="{\"key\":\"$key\",\"fingerprint\":\"image-check-payload\"}"

echo "running '${entrypoint[*]} ${cmd[*]}' as $user ($uid:$gid) in the image's files, on $base of a network namespace"
"${in_image[@]}" "${entrypoint[0]}" --version >"$work/version" 2>&1 || fail "--version failed: $(cat "$work/version")"
grep -q "$version" "$work/version" && grep -q "${commit:0:12}" "$work/version" ||
  fail "--version says '$(cat "$work/version")', not the build's $version and $commit"
start_daemon
status=$(post /v1/claim "$claim")
expect "a first claim" "$status" 201 '"outcome":"acquired"'
lease_token=$(sed -n 's/.*"lease_token":"\([^"]*\)".*/\1/p' "$work/body")
[ -n "$lease_token" ] || fail "the claim gave no lease_token: $(cat "$work/body")"
status=$(post /v1/complete "{\"key\":\"$key\",\"lease_token\":\"$lease_token\",\"response\":{\"status\":201,\"body\":\"aW1hZ2U=\"}}")
expect "complete" "$status" 200
"${in_image[@]}" "${healthcheck[@]:1}" || fail "the HEALTHCHECK '${healthcheck[*]:1}' failed against a running idemd"
stop_daemon
! "${in_image[@]}" "${healthcheck[@]:1}" 2>/dev/null || fail "the HEALTHCHECK passed with idemd stopped"
[ "$(stat -c %u "$rootfs/data/idemd.db" 2>/dev/null)" = "$uid" ] || fail "no /data/idemd.db of user $uid after a complete"

# Started again on the same /data, idemd has kept the result.
start_daemon
status=$(post /v1/claim "$claim")
expect "a claim after a restart" "$status" 200 '"outcome":"completed"'
grep -q '"body":"aW1hZ2U="' "$work/body" || fail "the replay lost the stored response: $(cat "$work/body")"
"${in_image[@]}" /idemctl --url "$base" lookup "$key" >"$work/lookup" 2>&1 || fail "/idemctl lookup failed: $(cat "$work/lookup")"
grep -q 'completed' "$work/lookup" || fail "/idemctl lookup does not show a completed record: $(cat "$work/lookup")"
stop_daemon

echo "the image works: /healthz, claim, complete, HEALTHCHECK, /idemctl as $uid, and /data kept across a restart ($SECONDS s in all)"
