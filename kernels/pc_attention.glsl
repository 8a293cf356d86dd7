// pc_attention.glsl: the push constants of the forward attention kernels (pc), mirrored field
// for field by forge__pc_attention (src/ops.c), which the host pushes whole to every one of
// them: attention_tiled.comp, attention_split.comp, attention_cm.comp and attention_decode.comp.
// One block for all: a kernel reads the fields it needs and leaves the rest (n_splits: the
// split kernels; eps, min_run: attention_decode). tools/build_kernels.sh records each module's
// block size (FORGE_SPV_PUSH_BYTES_<module>) and src/ops.c checks it equals
// sizeof(forge__pc_attention): a field goes into both, in the same place.
layout(push_constant) uniform PC {
    uint n_tokens, n_heads, n_kv_heads, head_dim, cache_slots, window;
    float scale, softcap;
    uint n_splits;   // attention_split, attention_decode: runs of keys per head (workgroup x)
    uint q_stride;   // floats between the query rows of two tokens (the fused qkv rows)
    uint kv_batch_stride, flags;
    float eps;       // attention_decode, flags 32, 64: the head norms' epsilon
    uint min_run;    // attention_decode: keys a workgroup takes at least (host: forge__attn_min_run)
} pc;
