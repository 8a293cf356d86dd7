#!/bin/sh
# check_dist.sh: the drop-in single file as an embedder uses it. Copies dist/forge.c,
# dist/forge.h and examples/generate.c (the README's library example) into an empty directory,
# compiles them there with nothing of this tree on the include path and glslang out of reach
# (commands of its names that fail come first on PATH), links the libraries the README names,
# and runs the example on the bundled model: it must print the model's story.
# Usage: tools/check_dist.sh   (from the repository root, after make dist; CI runs it)
set -eu
[ -f dist/forge.c ] && [ -f dist/forge.h ] || { echo "check_dist: no dist/forge.c and dist/forge.h (run make dist)" >&2; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir "$T/bin" "$T/src"
for g in glslangValidator glslang glslc; do
    printf '#!/bin/sh\necho "check_dist: %s was called: dist/forge.c must not need it" >&2\nexit 1\n' "$g" > "$T/bin/$g"
    chmod +x "$T/bin/$g"
done
cp dist/forge.c dist/forge.h examples/generate.c "$T/src/"
MODEL=$(pwd)/models/stories260K/stories260K.gguf
(
    cd "$T/src"
    export PATH="$T/bin:$PATH"
    ${CC:-cc} -std=c11 -O2 -Wall -Wno-format-truncation -Werror -c forge.c -o forge.o
    ${CC:-cc} -std=c11 -O2 -Wall -Werror generate.c forge.o -lcjson -lpcre2-8 -lutf8proc -lpthread -ldl -lm -o generate
    ./generate "$MODEL" > out.txt
    grep -q "^Once upon a time, there was a little girl named Lily" out.txt || { echo "check_dist: no story: $(head -c 300 out.txt)" >&2; exit 1; }
)
echo "check_dist: dist/forge.c ($(wc -c < dist/forge.c) bytes) compiled without glslang or the build tree, and its example printed the story"
