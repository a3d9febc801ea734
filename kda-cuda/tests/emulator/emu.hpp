// kda-cuda host emulator: runs the real kernel sources (src/kernels/*.cu) on the CPU.
//
// Every CUDA thread of a block is an OS thread; __syncthreads is a block-wide std::barrier,
// warp shuffles exchange through a per-warp buffer between two warp-wide barriers, shared
// memory is a per-block buffer poisoned with NaN between blocks. Blocks run one after another.
// This checks indexing, the math and the barrier structure of the kernels against a reference;
// it says nothing about GPU-specific behaviour (timing, memory model subtleties beyond what
// real concurrent threads expose, register limits, occupancy).
#pragma once

#include <barrier>
#include <cmath>
#include <math.h>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

struct EmuWarp {
    std::barrier<> bar{32};
    float vals[32];
};

struct EmuBlock {
    explicit EmuBlock(unsigned threads) : bar(threads), warps((threads + 31) / 32) {}
    std::barrier<> bar;
    std::vector<EmuWarp> warps;
    std::vector<float> dyn;
    std::mutex m;
    std::map<std::string, std::vector<char>> statics;
};

inline thread_local EmuBlock* emu_block = nullptr;

inline void __syncthreads() { emu_block->bar.arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int o) {
    EmuWarp& w = emu_block->warps[threadIdx.x / 32];
    const unsigned lane = threadIdx.x % 32;
    w.vals[lane] = v;
    w.bar.arrive_and_wait();
    const float r = w.vals[lane ^ (unsigned)o];
    w.bar.arrive_and_wait();
    return r;
}

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline int min(int a, int b) { return a < b ? a : b; }

inline float* emu_dynamic_smem() { return emu_block->dyn.data(); }

inline void* emu_static_smem(const char* name, std::size_t bytes) {
    std::lock_guard<std::mutex> g(emu_block->m);
    auto& v = emu_block->statics[name];
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
}

#define KDA_HOST_EMULATION 1
#define KDA_DYNAMIC_SMEM(name) float* name = emu_dynamic_smem()
#define KDA_SHARED_ARRAY(type, name, n) type* name = (type*)emu_static_smem(#name, sizeof(type) * (n))
#define KDA_FIELD(S, f, off) static_assert(offsetof(S, f) == (off), #S "." #f " offset")
#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(n)

// Runs kernel<<<grid, block, smem>>>(p): `block` threads, blocks in order.
template <class P>
void emu_launch(void (*kernel)(const P), dim3 grid, unsigned block, std::size_t smem_bytes, const P& p) {
    EmuBlock ctx(block);
    ctx.dyn.assign(smem_bytes / sizeof(float) + 1, NAN);
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (unsigned tid = 0; tid < block; ++tid) {
        threads.emplace_back([&, tid] {
            threadIdx = dim3{tid, 0, 0};
            blockDim = dim3{block, 1, 1};
            gridDim = grid;
            emu_block = &ctx;
            for (unsigned bz = 0; bz < grid.z; ++bz)
                for (unsigned by = 0; by < grid.y; ++by)
                    for (unsigned bx = 0; bx < grid.x; ++bx) {
                        blockIdx = dim3{bx, by, bz};
                        kernel(p);
                        ctx.bar.arrive_and_wait();
                        if (tid == 0) {  // poison shared memory for the next block
                            std::fill(ctx.dyn.begin(), ctx.dyn.end(), NAN);
                            for (auto& kv : ctx.statics)
                                std::fill(kv.second.begin(), kv.second.end(), (char)0xff);
                        }
                        ctx.bar.arrive_and_wait();
                    }
        });
    }
    for (auto& t : threads) t.join();
}
