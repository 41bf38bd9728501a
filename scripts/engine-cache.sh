# Sourced by scripts/install-*.sh: engines are built once per pinned version into a cache
# OUTSIDE the clone and linked into it, so a fresh clone on a machine that built them before
# spends seconds, not the ~10 minutes of llama.cpp's compile and vLLM's install.
#
#   ${CEILING_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ceiling/engines}/<name>-<version>-<hash>
#
# <hash> covers what decides the build: the install script's commands (comments left out, so
# rewording one does not cost a compile), the pins, the Python and the machine, and the C
# compiler. A pin change gives a new key, hence a new build; the old entry stays for clones that
# still pin it (delete ~/.cache/ceiling/engines/<entry> by hand to reclaim it).
#
# A virtual environment is not relocatable (its scripts name their absolute path), so the
# environment is built IN the cache directory and the clone's path (.engines/<name>) becomes a
# symbolic link to it. A clone whose .engines/<name> is a real directory keeps it (installed
# there, as before); CEILING_ENGINE_CACHE=off installs in the clone as before.
#
# Two clones installing at once: one builds, the other waits on the entry's lock (flock) and then
# links. A build that died half-way has no completion marker: the next install removes that
# entry (ours: created by this code, under the lock) and builds it again.

# engine_cache_begin NAME VERSION SCRIPT LINK [PIN...]
#   Decides where to install. Sets ENGINE_TARGET (the directory to install into) and
#   ENGINE_CACHED=1 when it is a cache entry that is already complete (nothing to build).
#   With the cache in use, holds the entry's lock on fd 9 until engine_cache_end.
engine_cache_begin() {
  local name=$1 version=$2 script=$3 link=$4
  shift 4
  ENGINE_LINK=$link
  ENGINE_TARGET=$link
  ENGINE_CACHED=0
  ENGINE_ENTRY=
  if [ "${CEILING_ENGINE_CACHE:-}" = off ] || { [ -e "$link" ] && [ ! -L "$link" ]; }; then
    return 0  # no cache, or a real directory in the clone: install there
  fi
  local root=${CEILING_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ceiling/engines}
  local hash
  hash=$(
    {
      grep -v '^[[:space:]]*#' "$script"
      printf '%s\n' "$version" "$@"
      "${PY:-python3}" -c 'import platform, sys; print(sys.version, platform.machine())'
      { cc --version 2>/dev/null || true; } | head -1
    } | sha256sum | cut -c1-12
  )
  mkdir -p "$root"
  ENGINE_ENTRY="$root/$name-$version-$hash"
  ENGINE_TARGET=$ENGINE_ENTRY
  exec 9>"$ENGINE_ENTRY.lock"
  if ! flock -n 9; then
    echo "waiting for another install of $ENGINE_ENTRY to finish"
    flock 9
  fi
  if [ -f "$ENGINE_ENTRY/.ceiling-complete" ]; then
    ENGINE_CACHED=1
    echo "$name $version: built before, reusing $ENGINE_ENTRY"
  elif [ -e "$ENGINE_ENTRY" ]; then
    echo "$name $version: removing an unfinished build in $ENGINE_ENTRY"
    rm -rf "$ENGINE_ENTRY"
  fi
}

# engine_cache_end: marks the entry complete, links the clone's path to it, releases the lock.
engine_cache_end() {
  [ -n "$ENGINE_ENTRY" ] || return 0
  [ -f "$ENGINE_ENTRY/.ceiling-complete" ] || date -u +%FT%TZ >"$ENGINE_ENTRY/.ceiling-complete"
  mkdir -p "$(dirname "$ENGINE_LINK")"
  ln -sfn "$ENGINE_ENTRY" "$ENGINE_LINK"
  flock -u 9
  exec 9>&-
  echo "$ENGINE_LINK -> $ENGINE_ENTRY"
}
