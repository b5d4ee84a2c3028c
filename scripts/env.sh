# Sourced by the project's scripts: locates the pinned CMake that scripts/setup.sh installed from PyPI (a fresh
# pyenv may not have a shim for it yet), and the build parallelism.
moekit_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOEKIT_CMAKE_DIR="$(python3 -c 'import cmake, sys; sys.stdout.write(cmake.CMAKE_BIN_DIR)' 2>/dev/null || true)"
if [[ -n "$MOEKIT_CMAKE_DIR" && -x "$MOEKIT_CMAKE_DIR/cmake" ]]; then
  export PATH="$MOEKIT_CMAKE_DIR:$PATH"
fi
MOEKIT_JOBS="${MOEKIT_JOBS:-$(nproc)}"
