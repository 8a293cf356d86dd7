/* Push constants from one source: the host pushes each kernel a forge__pc_* struct (src/ops.c)
 * that its GLSL block mirrors field for field (kernels/pc_*.glsl for the families several
 * kernels share). tools/build_kernels.sh records each module's block size
 * (FORGE_SPV_PUSH_BYTES_<module>) and src/ops.c asserts the structs against it; here every row
 * of forge__ops is checked to push exactly its module's block, and the recorded sizes against
 * the SPIR-V itself, read again by other code than the script's awk. No device needed. */
#include "internal.h"
#include "util.h"

#include <algorithm>
#include <functional>
#include <map>

namespace {

/* The size of the push-constant block of a SPIR-V module (0: none): the end of the last member
 * of the struct that the PushConstant variable points to. Sets *err for what it cannot size. */
uint32_t spirv_push_bytes(const uint32_t *w, size_t n, std::string *err) {
    enum Kind { NONE, SCALAR, VECTOR, ARRAY, STRUCT };
    struct Type {
        Kind kind = NONE;
        uint32_t width = 0, elem = 0, count = 0;
        std::vector<uint32_t> members;
    };
    std::map<uint32_t, Type> types;
    std::map<uint32_t, uint32_t> pointee, constant, array_stride;
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> offset;
    std::vector<uint32_t> vars;
    if (n < 5 || w[0] != 0x07230203u) {
        *err = "not SPIR-V";
        return 0;
    }
    for (size_t i = 5; i < n;) {
        uint32_t wc = w[i] >> 16, op = w[i] & 0xffffu;
        if (wc == 0 || i + wc > n) {
            *err = "malformed instruction at word " + std::to_string(i);
            return 0;
        }
        const uint32_t *a = w + i + 1;
        switch (op) {
        case 21: /* OpTypeInt */
        case 22: /* OpTypeFloat */ types[a[0]].kind = SCALAR, types[a[0]].width = a[1]; break;
        case 23: /* OpTypeVector */ types[a[0]].kind = VECTOR, types[a[0]].elem = a[1], types[a[0]].count = a[2]; break;
        case 28: /* OpTypeArray */ types[a[0]].kind = ARRAY, types[a[0]].elem = a[1], types[a[0]].count = a[2]; break;
        case 30: /* OpTypeStruct */ types[a[0]].kind = STRUCT, types[a[0]].members.assign(a + 1, a + wc - 1); break;
        case 32: /* OpTypePointer */ pointee[a[0]] = a[2]; break;
        case 43: /* OpConstant */
            if (wc == 4) constant[a[1]] = a[2];
            break;
        case 59: /* OpVariable */
            if (a[2] == 9) vars.push_back(a[0]); /* StorageClass PushConstant */
            break;
        case 71: /* OpDecorate */
            if (a[1] == 6) array_stride[a[0]] = a[2]; /* ArrayStride */
            break;
        case 72: /* OpMemberDecorate */
            if (a[2] == 35) offset[{a[0], a[1]}] = a[3]; /* Offset */
            break;
        }
        i += wc;
    }
    std::function<uint32_t(uint32_t)> size = [&](uint32_t id) -> uint32_t {
        const Type &t = types[id];
        switch (t.kind) {
        case SCALAR: return t.width / 8;
        case VECTOR: return t.count * size(t.elem);
        case ARRAY:
            if (!constant.count(t.count) || !array_stride.count(id)) *err = "an array of no constant length or stride";
            return constant[t.count] * array_stride[id];
        case STRUCT: {
            uint32_t end = 0;
            for (uint32_t m = 0; m < t.members.size(); m++) {
                if (!offset.count({id, m})) *err = "a member without Offset";
                end = std::max(end, offset[{id, m}] + size(t.members[m]));
            }
            return end;
        }
        default: *err = "a member of a type not sized here (id " + std::to_string(id) + ")"; return 0;
        }
    };
    uint32_t bytes = 0;
    for (uint32_t v : vars) bytes = std::max(bytes, size(pointee[v]));
    return bytes;
}

} // namespace

/* What build_kernels.sh wrote beside each module is its SPIR-V's block size. */
TEST(PushConstants, RecordedSizesAreTheModules) {
    ASSERT_GT(ft_module_count(), 0);
    for (int i = 0; i < ft_module_count(); i++) {
        const char *name;
        const uint32_t *words;
        size_t n;
        uint32_t recorded;
        ASSERT_TRUE(ft_module(i, &name, &words, &n, &recorded));
        std::string err;
        uint32_t bytes = spirv_push_bytes(words, n, &err);
        EXPECT_EQ(err, "") << name;
        EXPECT_EQ(bytes, recorded) << name << ": FORGE_SPV_PUSH_BYTES_" << name << " is not its SPIR-V's block size";
    }
}

/* Every op row pushes exactly the bytes its module's block declares (== and not <=: src/ops.c
 * says why), within the 128 bytes every Vulkan device takes. */
TEST(PushConstants, EveryOpPushesItsModulesBlock) {
    int checked = 0;
    for (int op = 0; op < ft_op_count(); op++) {
        const char *name;
        int module;
        uint32_t push;
        ft_op(op, &name, &module, &push);
        if (module < 0) { /* only a row this build leaves empty (matmul_cm & co. without GL_NV_cooperative_matrix) */
            EXPECT_EQ(name, nullptr) << "op " << op << " (" << name << ") runs no module of the generated header";
            continue;
        }
        const char *mname;
        const uint32_t *words;
        size_t n;
        uint32_t block;
        ASSERT_TRUE(ft_module(module, &mname, &words, &n, &block));
        EXPECT_EQ(push, block) << "op " << name << " pushes " << push << " bytes; its module " << mname << "'s block is " << block;
        EXPECT_LE(push, 128u) << "op " << name << ": maxPushConstantsSize is only guaranteed 128 bytes";
        checked++;
    }
    EXPECT_GT(checked, 100);
}
