// Tensor-core probe for a later kda-cuda change (not part of the library): checks the fragment
// layout this project assumes for `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`, and
// measures plain TF32 and split "3xTF32" (a = hi + lo; a*b ~ hi*hi + hi*lo + lo*hi) accuracy and
// speed on the chunk state pass's product shape (64 x 128 times 128 x 32, f32 data), against
// an f64 reference on the host and against a SIMT f32 loop on the device.
//
// Build and run on the GPU machine (nvcc is there; no Rust needed):
//   nvcc -O3 -arch=sm_90 -o /tmp/mma_probe kda-cuda/scripts/mma_probe.cu && /tmp/mma_probe
// Prints: layout ok / FAILED, worst rel-RMS of TF32, 3xTF32 and SIMT against f64, and the time
// per product of each variant (many blocks, so the numbers are throughput, not latency).
//
// Assumed layout (g = lane / 4, t = lane % 4), per the PTX ISA's m16n8k8 .tf32 tables:
//   A (16 x 8, row major): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
//   B (8 x 8, column):     b0 (t, g), b1 (t + 4, g)
//   C (16 x 8, f32):       c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstdio>
#include <vector>
#endif

#define M_ROWS 64
#define K_DIM 128
#define N_COLS 32

__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One block per product; 8 warps, warp w computes rows 16 (w / 2) .. + 16, columns 16 (w % 2) .. + 16
// (two 16 x 8 tiles). split: 0 plain TF32, 1 3xTF32.
// Dynamic shared memory: X [64][128] | S [128][32].
extern "C" __global__ void product_mma(const float* x, const float* s, float* out, int split) {
    extern __shared__ float sm[];
    float* xs = sm;
    float* ss = sm + M_ROWS * K_DIM;
    const float* xb = x + (size_t)blockIdx.x * M_ROWS * K_DIM;
    const float* sb = s + (size_t)blockIdx.x * K_DIM * N_COLS;
    for (int i = threadIdx.x; i < M_ROWS * K_DIM; i += blockDim.x) xs[i] = xb[i];
    for (int i = threadIdx.x; i < K_DIM * N_COLS; i += blockDim.x) ss[i] = sb[i];
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = 16 * (warp / 2);
    float acc[2][4] = {};
    for (int k0 = 0; k0 < K_DIM; k0 += 8) {
        const float af[4] = {xs[(r0 + g) * K_DIM + k0 + t], xs[(r0 + g + 8) * K_DIM + k0 + t],
                             xs[(r0 + g) * K_DIM + k0 + t + 4], xs[(r0 + g + 8) * K_DIM + k0 + t + 4]};
        unsigned ahi[4], alo[4];
        for (int i = 0; i < 4; ++i) {
            ahi[i] = to_tf32(af[i]);
            alo[i] = to_tf32(af[i] - __uint_as_float(ahi[i]));
        }
        for (int nt = 0; nt < 2; ++nt) {
            const int c0 = 16 * (warp % 2) + 8 * nt;
            const float bf[2] = {ss[(k0 + t) * N_COLS + c0 + g], ss[(k0 + t + 4) * N_COLS + c0 + g]};
            unsigned bhi[2], blo[2];
            for (int i = 0; i < 2; ++i) {
                bhi[i] = to_tf32(bf[i]);
                blo[i] = to_tf32(bf[i] - __uint_as_float(bhi[i]));
            }
            if (split) {
                mma_tf32(acc[nt], alo, bhi);
                mma_tf32(acc[nt], ahi, blo);
            }
            mma_tf32(acc[nt], ahi, bhi);
        }
    }
    float* ob = out + (size_t)blockIdx.x * M_ROWS * N_COLS;
    for (int nt = 0; nt < 2; ++nt) {
        const int c0 = 16 * (warp % 2) + 8 * nt;
        ob[(r0 + g) * N_COLS + c0 + 2 * t] = acc[nt][0];
        ob[(r0 + g) * N_COLS + c0 + 2 * t + 1] = acc[nt][1];
        ob[(r0 + g + 8) * N_COLS + c0 + 2 * t] = acc[nt][2];
        ob[(r0 + g + 8) * N_COLS + c0 + 2 * t + 1] = acc[nt][3];
    }
}

// The SIMT form kda_chunk_state uses: 256 threads, 2 x 4 outputs each.
// Dynamic shared memory: S [128][32] | X^T [128][65].
extern "C" __global__ void product_simt(const float* x, const float* s, float* out) {
    extern __shared__ float sm[];
    float* ss = sm;
    float* xt = sm + K_DIM * N_COLS;
    const float* xb = x + (size_t)blockIdx.x * M_ROWS * K_DIM;
    const float* sb = s + (size_t)blockIdx.x * K_DIM * N_COLS;
    for (int i = threadIdx.x; i < M_ROWS * K_DIM; i += blockDim.x) {
        const int r = i / K_DIM, d = i % K_DIM;
        xt[d * (M_ROWS + 1) + r] = xb[i];
    }
    for (int i = threadIdx.x; i < K_DIM * N_COLS; i += blockDim.x) ss[i] = sb[i];
    __syncthreads();
    const int rg = threadIdx.x >> 3, ec = 4 * (threadIdx.x & 7);
    float acc[2][4] = {};
    for (int d = 0; d < K_DIM; ++d) {
        const float x0 = xt[d * (M_ROWS + 1) + rg], x1 = xt[d * (M_ROWS + 1) + rg + 32];
        const float4 sv = *reinterpret_cast<const float4*>(ss + d * N_COLS + ec);
        const float s4[4] = {sv.x, sv.y, sv.z, sv.w};
        for (int c = 0; c < 4; ++c) {
            acc[0][c] += x0 * s4[c];
            acc[1][c] += x1 * s4[c];
        }
    }
    float* ob = out + (size_t)blockIdx.x * M_ROWS * N_COLS;
    for (int a = 0; a < 2; ++a)
        for (int c = 0; c < 4; ++c) ob[(rg + 32 * a) * N_COLS + ec + c] = acc[a][c];
}

#ifndef __CUDACC_RTC__
// rel-RMS of got's first want.size() values against want.
static double rel_rms(const std::vector<float>& got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

int main() {
    const int blocks = 4096;
    const size_t nx = (size_t)blocks * M_ROWS * K_DIM, ns = (size_t)blocks * K_DIM * N_COLS,
                 no = (size_t)blocks * M_ROWS * N_COLS;
    std::vector<float> x(nx), s(ns);
    unsigned long long st = 12345;
    auto rnd = [&]() {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        return (float)((double)(st >> 11) / (double)(1ULL << 53) * 2.0 - 1.0);
    };
    for (auto& v : x) v = rnd();
    for (auto& v : s) v = rnd();
    // f64 reference for the first 8 blocks.
    const int checked = 8;
    std::vector<double> ref((size_t)checked * M_ROWS * N_COLS);
    for (int b = 0; b < checked; ++b)
        for (int i = 0; i < M_ROWS; ++i)
            for (int j = 0; j < N_COLS; ++j) {
                double a = 0;
                for (int d = 0; d < K_DIM; ++d)
                    a += (double)x[(size_t)b * M_ROWS * K_DIM + i * K_DIM + d] *
                         (double)s[(size_t)b * K_DIM * N_COLS + d * N_COLS + j];
                ref[(size_t)b * M_ROWS * N_COLS + i * N_COLS + j] = a;
            }
    float *dx, *ds, *dout;
    cudaMalloc(&dx, nx * 4);
    cudaMalloc(&ds, ns * 4);
    cudaMalloc(&dout, no * 4);
    cudaMemcpy(dx, x.data(), nx * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(ds, s.data(), ns * 4, cudaMemcpyHostToDevice);
    std::vector<float> out(no);
    const int smem_mma = 4 * (M_ROWS * K_DIM + K_DIM * N_COLS);
    const int smem_simt = 4 * (K_DIM * N_COLS + K_DIM * (M_ROWS + 1));
    cudaFuncSetAttribute(product_mma, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_mma);
    cudaFuncSetAttribute(product_simt, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_simt);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const char* names[3] = {"tf32", "3xtf32", "simt f32"};
    int failures = 0;
    for (int v = 0; v < 3; ++v) {
        auto go = [&]() {
            if (v < 2)
                product_mma<<<blocks, 256, smem_mma>>>(dx, ds, dout, v);
            else
                product_simt<<<blocks, 256, smem_simt>>>(dx, ds, dout);
        };
        go();
        cudaDeviceSynchronize();
        cudaEventRecord(e0);
        for (int it = 0; it < 10; ++it) go();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        cudaError_t err = cudaGetLastError();
        cudaMemcpy(out.data(), dout, no * 4, cudaMemcpyDeviceToHost);
        const double r = rel_rms(out, ref);
        const double flops = 2.0 * M_ROWS * K_DIM * N_COLS * blocks;
        // tf32 keeps ~11 bits: a layout error shows as rel-RMS ~1, a right layout as ~1e-3 or less.
        const bool ok = err == cudaSuccess && r < 5e-3;
        failures += !ok;
        std::printf("%-9s rel-RMS vs f64 %.2e  %7.1f us per %d products (%.1f TFLOP/s)  %s%s\n", names[v], r,
                    ms * 1e3 / 10, blocks, flops / (ms / 10 * 1e-3) / 1e12, ok ? "ok" : "FAILED",
                    err == cudaSuccess ? "" : cudaGetErrorString(err));
    }
    std::printf("mma fragment layout: %s\n", failures == 0 ? "ok" : "FAILED");
    return failures == 0 ? 0 : 1;
}
#endif
