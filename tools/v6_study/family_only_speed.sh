#!/usr/bin/env bash
# What issue 26's CPU compress criterion (>= 1.5x version 5's, one core) asks of any design that
# sizes every block exactly: this checkout's codec built with its group code switched off
# (family_only.patch: each block takes the family member with the smallest exact size, or raw, as the
# issue filed the design; the streams stay valid version-6 streams, without the group code's ratio),
# timed by `bench codec --against` beside version 5's build. Not run by CI: it needs version 5's build.
# Usage: bash tools/v6_study/family_only_speed.sh V5/_zipccl_cpu.so OUT_DIR [bench codec options]
#   (e.g. --repeat 7 --rounds 5 --core 1 --elements 262144)
set -eu
v5=$(realpath "${1:?V5 _zipccl_cpu.so}"); out=$(realpath -m "${2:?OUT_DIR}"); shift 2
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
python=${PYTHON:-python}
[ -e "$out" ] && { echo "family_only_speed: $out exists; give a new directory" >&2; exit 2; }
mkdir -p "$out"
git -C "$repo" worktree add -q --detach "$out/src" HEAD
trap 'git -C "$repo" worktree remove --force "$out/src"' EXIT
git -C "$out/src" apply "$repo/tools/v6_study/family_only.patch"
"$python" -m pip install -q --no-deps --target "$out/pkg" "$out/src"
cd "$out" && PYTHONPATH="$out/pkg" "$python" -m zipccl_jax bench codec --against "$v5" "$@"
