#!/usr/bin/env bash
# Installs what moekit's build needs on a fresh Debian machine and fills the project-local dependency folder
# (.deps, git-ignored) that CMake reads. Idempotent: a second run changes nothing. A GPU machine without network
# builds from a copy of .deps carried along with the source.
#   scripts/setup.sh            install packages (when missing) and fill .deps
#   scripts/setup.sh PKG...     the same, with more Debian packages (e.g. clang for the sanitizer build)
#   MOEKIT_SKIP_APT=1 ...       fill .deps only from what is installed
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEKIT_DEPS_DIR:-$root/.deps}"
cmake_version="3.31.6"    # pinned: Debian 12's CMake 3.25 lacks nvcc's C++20 dialect flag
cutlass_version="4.2.0.0"  # pinned: nvidia-cutlass on PyPI ships the CUTLASS/CuTe C++ headers
sass_tools_version="13.5.37"  # pinned: nvidia-cuda-cuobjdump / -nvdisasm on PyPI (the SASS check, where nvcc lacks them)
apt_packages=(cmake ninja-build g++ python3-pip nlohmann-json3-dev libfmt-dev libcli11-dev googletest "$@")

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})) && [[ "${MOEKIT_SKIP_APT:-0}" != 1 ]]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ "$(python3 -c 'import cmake; print(cmake.__version__)' 2>/dev/null)" != "$cmake_version" ]]; then
  echo "setup: installing cmake==$cmake_version from PyPI"
  python3 -m pip install -q --disable-pip-version-check "cmake==$cmake_version"
  hash -r
fi

mkdir -p "$deps/include"
copy_dir() {  # copy_dir SRC DST: replace DST by SRC when they differ
  if [[ ! -d "$2" ]] || ! diff -rq "$1" "$2" >/dev/null 2>&1; then
    rm -rf "$2"; cp -r "$1" "$2"; echo "setup: $2 <- $1"
  fi
}
copy_dir /usr/include/nlohmann "$deps/include/nlohmann"
copy_dir /usr/include/CLI "$deps/include/CLI"
copy_dir /usr/include/fmt "$deps/include/fmt"
copy_dir /usr/src/googletest "$deps/googletest"

stamp="$deps/cutlass/VERSION"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$cutlass_version" ]]; then
  tmp="$(mktemp -d)"
  python3 -m pip download -q --no-deps "nvidia-cutlass==$cutlass_version" -d "$tmp"
  python3 - "$tmp" <<'PY'
import sys, zipfile, glob
whl = glob.glob(sys.argv[1] + "/nvidia_cutlass-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("cutlass_library/source/include/")]
    z.extractall(sys.argv[1] + "/x", names)
PY
  rm -rf "$deps/cutlass"; mkdir -p "$deps/cutlass"
  mv "$tmp/x/cutlass_library/source/include" "$deps/cutlass/include"
  echo "$cutlass_version" >"$stamp"
  rm -rf "$tmp"
  echo "setup: CUTLASS $cutlass_version headers in $deps/cutlass/include"
fi
# cuobjdump and the nvdisasm it runs, for the SASS check (tests/CMakeLists.txt), where nvcc is installed without
# them: NVIDIA's PyPI wheels.
nvcc_path="$(command -v nvcc || true)"
if [[ -n "$nvcc_path" && ! -x "$(dirname "$nvcc_path")/cuobjdump" ]]; then
  for tool in cuobjdump nvdisasm; do
    stamp="$deps/bin/$tool.version"
    if [[ -x "$deps/bin/$tool" && "$(cat "$stamp" 2>/dev/null)" == "$sass_tools_version" ]]; then continue; fi
    tmp="$(mktemp -d)"
    python3 -m pip download -q --no-deps "nvidia-cuda-$tool==$sass_tools_version" -d "$tmp"
    python3 - "$tmp" "$deps/bin" "$tool" <<'PY'
import glob, os, sys, zipfile
tmp, out, tool = sys.argv[1:4]
whl = glob.glob(f"{tmp}/nvidia_cuda_{tool}-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(f"/bin/{tool}"))
    os.makedirs(out, exist_ok=True)
    with z.open(name) as src, open(f"{out}/{tool}", "wb") as dst:
        dst.write(src.read())
os.chmod(f"{out}/{tool}", 0o755)
PY
    echo "$sass_tools_version" >"$stamp"
    rm -rf "$tmp"
    echo "setup: $tool $sass_tools_version in $deps/bin"
  done
fi
echo "setup: dependencies ready in $deps"
