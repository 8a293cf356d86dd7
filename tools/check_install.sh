#!/bin/sh
# Installs forge into temporary prefixes and builds the examples against the installed trees as
# a user would, then runs each on the installed bundled model:
#   - `make install` (PREFIX): examples/generate.c and examples/chat.cpp through
#     pkg-config, against the shared library (soname libforge.so.MAJOR) and the static one;
#     the Python package from the installed site directory (the system's library lookup); the
#     Go example built with -tags forge_system (pkg-config);
#   - with a CMake build directory as $1: `cmake --install` of it, and a CMake project that
#     finds forge with find_package(forge) and links forge::forge and forge::forge_shared.
# Usage: tools/check_install.sh [CMAKE_BUILD_DIR]   (run from the repository root; CI runs it)
set -eu
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "check_install: $*" >&2; exit 1; }
expect_story() { # FILE: the bundled model's greedy story, and the chat part's verdict
    grep -q "^Once upon a time, there was a little girl named Lily" "$1" || fail "$1: no story: $(head -c 300 "$1")"
    grep -q "no chat template" "$1" || fail "$1: the chat part did not run"
}
MAJOR=$(awk '$2 == "FORGE_VERSION_MAJOR" { print $3 }' forge.h)
VERSION=$MAJOR.$(awk '$2 == "FORGE_VERSION_MINOR" { print $3 }' forge.h).$(awk '$2 == "FORGE_VERSION_PATCH" { print $3 }' forge.h)

echo "== make install PREFIX=$T/make"
make -s install PREFIX="$T/make" >/dev/null
P=$T/make
MODEL=$P/share/forge/stories260K.gguf
[ -f "$P/lib/libforge.so.$VERSION" ] && [ -L "$P/lib/libforge.so.$MAJOR" ] && [ -L "$P/lib/libforge.so" ] || fail "libforge.so.$VERSION and its links are not installed"
readelf -d "$P/lib/libforge.so.$VERSION" | grep -q "SONAME.*\[libforge.so.$MAJOR\]" || fail "the soname is not libforge.so.$MAJOR"
"$P/bin/forge" --version | grep -qx "forge $VERSION" || fail "forge --version is not $VERSION"
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
[ "$(pkg-config --modversion forge)" = "$VERSION" ] || fail "pkg-config --modversion forge is not $VERSION"
# shared: what a plain `pkg-config --libs` gives
cc -std=c11 -Wall -Werror examples/generate.c $(pkg-config --cflags --libs forge) -o "$T/generate_shared"
c++ -std=c++17 -Wall -Werror examples/chat.cpp $(pkg-config --cflags --libs forge) -o "$T/chat_shared"
readelf -d "$T/chat_shared" | grep -q "NEEDED.*\[libforge.so.$MAJOR\]" || fail "example_chat does not need libforge.so.$MAJOR"
LD_LIBRARY_PATH=$P/lib "$T/generate_shared" "$MODEL" > "$T/out1" && expect_story "$T/out1"
LD_LIBRARY_PATH=$P/lib "$T/chat_shared" "$MODEL" > "$T/out2" && expect_story "$T/out2"
# static: the archive and its private dependencies
cc -std=c11 -Wall -Werror examples/generate.c $(pkg-config --cflags forge) "$P/lib/libforge.a" $(pkg-config --static --libs-only-l forge | sed 's/-lforge//') -o "$T/generate_static"
readelf -d "$T/generate_static" | grep -q "libforge" && fail "the static example still needs libforge.so"
"$T/generate_static" "$MODEL" > "$T/out3" && expect_story "$T/out3"
# Python: the package as installed, the library found by the system's lookup (LD_LIBRARY_PATH here)
SITE=$(find "$P/lib" -type d -path "*-packages/forge" | head -n 1)
[ -n "$SITE" ] || fail "the Python package is not installed under $P/lib"
PYTHONPATH=$(dirname "$SITE") LD_LIBRARY_PATH=$P/lib ${PYTHON:-python3} examples/stream.py "$MODEL" > "$T/out4" && expect_story "$T/out4"
# Go: the package with -tags forge_system links the installed library through pkg-config
GO=${GO:-$(command -v /usr/lib/go-1.23/bin/go || command -v go)}
mkdir -p "$T/go-tmp"
GOCACHE=$T/go-cache GOPATH=$T/go-path GOTMPDIR=$T/go-tmp GOTOOLCHAIN=local GOFLAGS=-mod=readonly GOPROXY=off \
    "$GO" build -tags forge_system -o "$T/run_go" ./bindings/go/examples/run
readelf -d "$T/run_go" | grep -q "NEEDED.*\[libforge.so.$MAJOR\]" || fail "the Go example does not need libforge.so.$MAJOR"
LD_LIBRARY_PATH=$P/lib "$T/run_go" "$MODEL" > "$T/out7" && expect_story "$T/out7"
echo "pkg-config (shared, static), Python and Go against the installed tree: ok"

if [ $# -ge 1 ]; then
    echo "== cmake --install $1 --prefix $T/cmake"
    cmake --install "$1" --prefix "$T/cmake" >/dev/null
    mkdir "$T/consumer"
    cat > "$T/consumer/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(forge_consumer C CXX)
find_package(forge $VERSION REQUIRED)
add_executable(generate_static $(pwd)/examples/generate.c)
target_link_libraries(generate_static PRIVATE forge::forge)
add_executable(chat_shared $(pwd)/examples/chat.cpp)
set_target_properties(chat_shared PROPERTIES CXX_STANDARD 17)
target_link_libraries(chat_shared PRIVATE forge::forge_shared)
CMAKE
    cmake -S "$T/consumer" -B "$T/consumer/build" -DCMAKE_PREFIX_PATH="$T/cmake" >/dev/null
    cmake --build "$T/consumer/build" >/dev/null
    CM=$(find "$T/cmake" -name stories260K.gguf | head -n 1)
    "$T/consumer/build/generate_static" "$CM" > "$T/out5" && expect_story "$T/out5"
    "$T/consumer/build/chat_shared" "$CM" > "$T/out6" && expect_story "$T/out6"
    PKG_CONFIG_PATH=$(dirname "$(find "$T/cmake" -name forge.pc | head -n 1)") pkg-config --modversion forge | grep -qx "$VERSION" || fail "the CMake install's forge.pc"
    echo "find_package(forge) against the CMake install: ok"
fi
