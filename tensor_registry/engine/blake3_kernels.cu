// BLAKE3 subtrees and parents of a layout manifest's chunks (tensor_registry/engine/gpu_blake3.py).
//
// One source for two builds: NVRTC compiles it for the CUDA device (kernels launched on the
// engine's copy streams), the host C compiler for the tests and CPU tensors (the same thread
// bodies in a loop). Standard BLAKE3, unkeyed: every manifest chunk is its own BLAKE3 input,
// so a leaf's counter is its 1 KiB index inside the chunk.
//
// leaves: thread t hashes LEAVES consecutive 1 KiB leaves of the chunk data into their subtree
// value out[t] (8 words); with subs == 1 (a chunk of LEAVES KiB) that value is the chunk's root.
// parents: thread j makes parent j of children 2j and 2j+1; root != 0 on the last level.

#ifdef __CUDACC_RTC__
typedef unsigned int u32;
typedef unsigned long long u64;
#define BODY __device__ __forceinline__
#define UNROLL _Pragma("unroll")
#else
#include <stdint.h>
#include <string.h>
typedef uint32_t u32;
typedef uint64_t u64;
#define BODY static inline
#define UNROLL
#endif

#define LEAVES 16
#define LEVELS 4
#define CHUNK_START 1u
#define CHUNK_END 2u
#define PARENT 4u
#define ROOT 8u

#define IV0 0x6A09E667u
#define IV1 0xBB67AE85u
#define IV2 0x3C6EF372u
#define IV3 0xA54FF53Au
#define IV4 0x510E527Fu
#define IV5 0x9B05688Cu
#define IV6 0x1F83D9ABu
#define IV7 0x5BE0CD19u

BODY u32 rotr(u32 x, int n) { return (x >> n) | (x << (32 - n)); }

#define G(a, b, c, d, x, y)      \
    a = a + b + (x);             \
    d = rotr(d ^ a, 16);         \
    c = c + d;                   \
    b = rotr(b ^ c, 12);         \
    a = a + b + (y);             \
    d = rotr(d ^ a, 8);          \
    c = c + d;                   \
    b = rotr(b ^ c, 7);

// One compression of the 16 message words m with chaining value cv (updated in place).
BODY void compress(u32 cv[8], u32 m[16], u32 counter, u32 flags) {
    u32 v0 = cv[0], v1 = cv[1], v2 = cv[2], v3 = cv[3];
    u32 v4 = cv[4], v5 = cv[5], v6 = cv[6], v7 = cv[7];
    u32 v8 = IV0, v9 = IV1, v10 = IV2, v11 = IV3;
    u32 v12 = counter, v13 = 0, v14 = 64, v15 = flags;
    UNROLL
    for (int r = 0; r < 7; r++) {
        G(v0, v4, v8, v12, m[0], m[1]);
        G(v1, v5, v9, v13, m[2], m[3]);
        G(v2, v6, v10, v14, m[4], m[5]);
        G(v3, v7, v11, v15, m[6], m[7]);
        G(v0, v5, v10, v15, m[8], m[9]);
        G(v1, v6, v11, v12, m[10], m[11]);
        G(v2, v7, v8, v13, m[12], m[13]);
        G(v3, v4, v9, v14, m[14], m[15]);
        if (r < 6) {  // BLAKE3's message permutation
            u32 t0 = m[0], t1 = m[1], t2 = m[2], t3 = m[3], t4 = m[4], t5 = m[5];
            u32 t6 = m[6], t7 = m[7], t8 = m[8], t9 = m[9], t10 = m[10], t11 = m[11];
            u32 t12 = m[12], t13 = m[13], t14 = m[14], t15 = m[15];
            m[0] = t2; m[1] = t6; m[2] = t3; m[3] = t10; m[4] = t7; m[5] = t0;
            m[6] = t4; m[7] = t13; m[8] = t1; m[9] = t11; m[10] = t12; m[11] = t5;
            m[12] = t9; m[13] = t14; m[14] = t15; m[15] = t8;
        }
    }
    cv[0] = v0 ^ v8; cv[1] = v1 ^ v9; cv[2] = v2 ^ v10; cv[3] = v3 ^ v11;
    cv[4] = v4 ^ v12; cv[5] = v5 ^ v13; cv[6] = v6 ^ v14; cv[7] = v7 ^ v15;
}

BODY void load_block(u32 m[16], const u32* p) {
#ifdef __CUDACC_RTC__
    const uint4* q = (const uint4*)p;  // 16-byte loads: the staged blocks start on a chunk
    UNROLL
    for (int i = 0; i < 4; i++) {
        uint4 w = q[i];
        m[4 * i] = w.x; m[4 * i + 1] = w.y; m[4 * i + 2] = w.z; m[4 * i + 3] = w.w;
    }
#else
    memcpy(m, p, 64);
#endif
}

BODY void iv(u32 cv[8]) {
    cv[0] = IV0; cv[1] = IV1; cv[2] = IV2; cv[3] = IV3;
    cv[4] = IV4; cv[5] = IV5; cv[6] = IV6; cv[7] = IV7;
}

// The parent of two 8-word children, into left.
BODY void parent(u32 left[8], const u32 right[8], u32 flags) {
    u32 m[16];
    for (int i = 0; i < 8; i++) { m[i] = left[i]; m[8 + i] = right[i]; }
    iv(left);
    compress(left, m, 0, PARENT | flags);
}

BODY void leaves_thread(const u32* data, u32* out, u32 subs, u64 t) {
    const u32* base = data + t * (u64)(LEAVES * 256);
    u32 counter = (u32)(t % subs) * LEAVES;
    u32 stack[LEVELS + 1][8];
    int depth = 0;
    for (u32 i = 0; i < LEAVES; i++) {
        u32 cv[8], m[16];
        iv(cv);
        const u32* leaf = base + i * 256;
        for (int b = 0; b < 16; b++) {
            load_block(m, leaf + b * 16);
            u32 flags = (b == 0 ? CHUNK_START : 0u) | (b == 15 ? CHUNK_END : 0u);
            compress(cv, m, counter + i, flags);
        }
        // Merge finished subtrees: one parent per trailing one bit of the leaves done so far.
        for (u32 done = i + 1; (done & 1u) == 0; done >>= 1) {
            depth--;
            u32 flags = (subs == 1 && depth == 0 && i == LEAVES - 1) ? ROOT : 0u;
            parent(stack[depth], cv, flags);
            for (int w = 0; w < 8; w++) cv[w] = stack[depth][w];
        }
        for (int w = 0; w < 8; w++) stack[depth][w] = cv[w];
        depth++;
    }
    for (int w = 0; w < 8; w++) out[t * 8 + w] = stack[0][w];
}

BODY void parents_thread(const u32* src, u32* dst, u32 root, u64 j) {
    u32 cv[8];
    for (int w = 0; w < 8; w++) cv[w] = src[j * 16 + w];
    parent(cv, src + j * 16 + 8, root ? ROOT : 0u);
    for (int w = 0; w < 8; w++) dst[j * 8 + w] = cv[w];
}

#ifdef __CUDACC_RTC__
extern "C" __global__ void leaves(const u32* data, u32* out, u32 subs, u64 n) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) leaves_thread(data, out, subs, t);
}

extern "C" __global__ void parents(const u32* src, u32* dst, u32 root, u64 n) {
    u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) parents_thread(src, dst, root, j);
}
#else
void leaves(const u32* data, u32* out, u32 subs, u64 n) {
    for (u64 t = 0; t < n; t++) leaves_thread(data, out, subs, t);
}

void parents(const u32* src, u32* dst, u32 root, u64 n) {
    for (u64 j = 0; j < n; j++) parents_thread(src, dst, root, j);
}
#endif
