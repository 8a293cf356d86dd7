#!/bin/sh
# build_kernels.sh GLSLANG KERNEL_DIR OUT_HEADER
# Compiles every kernel listed in KERNEL_DIR/kernels.list to SPIR-V with glslang and writes
# one C header holding them as static uint32_t arrays (forge_spv_<name>), so the library
# reads no files at run time. Lines whose fourth column names a GLSL extension are compiled
# only when this glslang accepts that extension (probed once), and the header says which.
# Beside each module it records the size of its push-constant block, read from the SPIR-V
# itself (FORGE_SPV_PUSH_BYTES_<name>; 0: none), and FORGE_SPV_MODULES(X) lists the modules,
# so src/ops.c and the tests can check the C structs the host pushes against the kernels.
set -eu
GLSLANG=$1
KDIR=$2
OUT=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

probe() { # probe EXT: does glslang compile a compute shader that enables EXT?
    printf '#version 450\n#extension %s : require\nlayout(local_size_x = 1) in;\nvoid main() {}\n' "$1" > "$TMP/probe.comp"
    "$GLSLANG" -V --target-env vulkan1.2 -o "$TMP/probe.spv" "$TMP/probe.comp" >/dev/null 2>&1
}

: > "$TMP/jobs"
: > "$TMP/exts"
grep -v '^[[:space:]]*#' "$KDIR/kernels.list" | grep -v '^[[:space:]]*$' | while read -r name src rest; do
    defs=""
    req=""
    for w in $rest; do
        case "$w" in
            -D*) defs="$defs $w" ;;
            requires=*) req=${w#requires=} ;;
        esac
    done
    if [ -n "$req" ]; then
        if ! grep -qx "$req=1" "$TMP/exts" && ! grep -qx "$req=0" "$TMP/exts"; then
            if probe "$req"; then echo "$req=1" >> "$TMP/exts"; else echo "$req=0" >> "$TMP/exts"; fi
        fi
        grep -qx "$req=1" "$TMP/exts" || continue
    fi
    echo "$name $src$defs" >> "$TMP/jobs"
done

# compile in parallel; each job writes $TMP/<name>.h
NPROC=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
export GLSLANG KDIR TMP
xargs -P "$NPROC" -L 1 sh -c '
    name=$0; src=$1; shift 1
    if ! "$GLSLANG" -V --target-env vulkan1.2 -I"$KDIR" "$@" --vn "forge_spv_$name" -o "$TMP/$name.h" "$KDIR/$src" > "$TMP/$name.log" 2>&1; then
        echo "glslang failed on $src ($name):" >&2; cat "$TMP/$name.log" >&2; exit 255
    fi' < "$TMP/jobs"

# The push-constant block of each module, from its SPIR-V words (the 0x... of glslang's --vn
# output): the OpVariable in StorageClass PushConstant (9), its pointer's struct type, and the
# end of that struct's last member (Offset decoration + the member's size; arrays by their
# ArrayStride). The block's size is what the pipeline's push range must cover. Types a block
# here does not use (matrices, buffer references) stop the build rather than guess.
cat > "$TMP/push.awk" <<'AWK'
function hex(s,   n, i) {
    n = 0
    for (i = 3; i <= length(s); i++) n = n * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
    return n
}
function fail(msg) { print "build_kernels.sh: " name ": " msg > "/dev/stderr"; bad = 1; exit 1 }
function size_of(t,   k, e, end) {
    if (kind[t] == "scalar") return width[t] / 8
    if (kind[t] == "vector") return count[t] * size_of(elem[t])
    if (kind[t] == "array") {
        if (!(count[t] in cval)) fail("push-constant array of a length not a constant")
        if (!(t in stride)) fail("push-constant array without ArrayStride")
        return cval[count[t]] * stride[t]
    }
    if (kind[t] == "struct") {
        e = 0
        for (k = 0; k < nmem[t]; k++) {
            if (!((t, k) in off)) fail("push-constant member " k " without Offset")
            end = off[t, k] + size_of(mem[t, k])
            if (end > e) e = end
        }
        return e
    }
    fail("push-constant member of a type this script does not size (id " t ")")
}
/^[ \t]*0x/ {
    line = tolower($0)
    while (match(line, /0x[0-9a-f]+/)) {
        w[nw++] = hex(substr(line, RSTART, RLENGTH))
        line = substr(line, RSTART + RLENGTH)
    }
}
END {
    if (bad) exit 1
    if (nw < 5 || w[0] != 119734787) fail("not SPIR-V (no magic number 0x07230203)")
    n_pc = 0
    for (i = 5; i < nw; i += wc) {
        wc = int(w[i] / 65536); op = w[i] % 65536
        if (wc < 1 || i + wc > nw) fail("malformed instruction at word " i)
        if (op == 21 || op == 22) { kind[w[i + 1]] = "scalar"; width[w[i + 1]] = w[i + 2] }          # OpTypeInt, OpTypeFloat
        else if (op == 23) { kind[w[i + 1]] = "vector"; elem[w[i + 1]] = w[i + 2]; count[w[i + 1]] = w[i + 3] } # OpTypeVector
        else if (op == 28) { kind[w[i + 1]] = "array"; elem[w[i + 1]] = w[i + 2]; count[w[i + 1]] = w[i + 3] }  # OpTypeArray
        else if (op == 30) {                                                                    # OpTypeStruct
            kind[w[i + 1]] = "struct"; nmem[w[i + 1]] = wc - 2
            for (k = 2; k < wc; k++) mem[w[i + 1], k - 2] = w[i + k]
        }
        else if (op == 32) pointee[w[i + 1]] = w[i + 3]                                         # OpTypePointer
        else if (op == 43 && wc == 4) cval[w[i + 2]] = w[i + 3]                                 # OpConstant (32-bit)
        else if (op == 59 && w[i + 3] == 9) pcvar[n_pc++] = w[i + 1]                            # OpVariable, PushConstant
        else if (op == 71 && w[i + 2] == 6) stride[w[i + 1]] = w[i + 3]                         # OpDecorate ArrayStride
        else if (op == 72 && w[i + 3] == 35) off[w[i + 1], w[i + 2]] = w[i + 4]                 # OpMemberDecorate Offset
    }
    bytes = 0
    for (v = 0; v < n_pc; v++) {
        if (!(pcvar[v] in pointee)) fail("push-constant variable of no pointer type")
        s = size_of(pointee[pcvar[v]])
        if (s > bytes) bytes = s
    }
    print bytes
}
AWK
: > "$TMP/push"
while read -r name rest; do
    bytes=$(awk -v name="$name" -f "$TMP/push.awk" "$TMP/$name.h") || exit 1
    echo "$name $bytes" >> "$TMP/push"
done < "$TMP/jobs"

{
    echo "/* Generated by tools/build_kernels.sh from kernels/: do not edit. */"
    echo "#ifndef FORGE_KERNELS_H"
    echo "#define FORGE_KERNELS_H"
    echo "#include <stdint.h>"
    while IFS= read -r line; do
        e=${line%=*}; v=${line#*=}
        macro=$(echo "$e" | tr 'a-z' 'A-Z' | sed 's/^GL_/FORGE_SPV_HAVE_/')
        echo "#define $macro $v"
    done < "$TMP/exts"
    echo "/* Each module forge_spv_<name> is followed by FORGE_SPV_PUSH_BYTES_<name>, the size in bytes"
    echo " * of its push-constant block (0: it has none); FORGE_SPV_MODULES(X) is X(name) for each. */"
    while read -r name bytes; do
        sed -e 's/^const uint32_t/static const uint32_t/' -e '/#pragma once/d' "$TMP/$name.h"
        echo "#define FORGE_SPV_PUSH_BYTES_$name $bytes"
    done < "$TMP/push"
    printf '%s\n' '#define FORGE_SPV_MODULES(X) \'
    while read -r name bytes; do
        printf '    X(%s) \\\n' "$name"
    done < "$TMP/push"
    echo "    /* (end of FORGE_SPV_MODULES) */"
    echo "#endif"
} > "$TMP/out.h"
mv "$TMP/out.h" "$OUT"
