/* cuda_kv.h — the CUDA backend's paged KV layout in device memory (comet_kv_cache.storage).
 *
 * One allocation holds every layer's pages. The unit is a head tile: the P slots of one
 * KV head of one page, for K or for V, in one layer. Inside a head tile the codes of the P
 * slots come first, one row per slot, then (quantized formats) the fp16 scale and zero of
 * each group of G channels of each slot, so a page's scales sit beside its codes:
 *
 *   head tile (layer, page, kv, h) at byte ((((layer * n_pages + page) * 2 + kv) * Hkv + h)
 *                                           * head_tile_bytes)      kv: 0 = K, 1 = V
 *   codes of slot j:        tile + j * code_row_bytes
 *       kv_bits 4:  D / 2 bytes; channel c in byte c / 2, low nibble for even c, high
 *                   nibble for odd c; codes 0..15 (unsigned)
 *       kv_bits 8:  D bytes, codes 0..255 (unsigned)
 *       kv_bits 0 / 16: D fp16 values (2 D bytes); no scales
 *   scale, zero of slot j, group i (channels i*G .. i*G+G-1), kv_bits 4 / 8:
 *       tile + sz_offset + j * sz_row_bytes + 4 * i: fp16 scale, then fp16 zero
 *   value = (float)code * scale + zero   (docs/numerics.md "KV cache", comet_quant_kv_group)
 *
 * sz_offset = roundup(P * code_row_bytes, 16), head_tile_bytes = sz_offset +
 * roundup(P * sz_row_bytes, 16): every head tile, code row start of a 16-byte aligned tile
 * (D % 8 == 0) and scale row is aligned for the kernels' 4, 8 and 16-byte loads. With the
 * hadamard rotation the stored vectors are H_D k and H_D v (after RoPE for k).
 *
 * Also here: the step's batch on the device as the RoPE / KV append and attention kernels
 * read it (comet_cuda_step_view).
 *
 * Plain C (no CUDA types): cuda_backend.c sizes the storage with it, rope_kv.cu writes it
 * and attention.cu reads it; the kernels' code width (`bits`) selects their template
 * instances through paged_kv.cuh's with_kv_bits.
 */
#ifndef COMET_BACKEND_CUDA_CUDA_KV_H
#define COMET_BACKEND_CUDA_CUDA_KV_H

#include <stddef.h>
#include <stdint.h>

/* Largest head dim and page size of the CUDA attention and KV kernels. */
#define COMET_CUDA_KV_MAX_HEAD_DIM 256
#define COMET_CUDA_KV_MAX_PAGE_SIZE 256

typedef struct comet_cuda_kv_layout {
    int n_layer, n_pages;
    int P, Hkv, D;
    int G;              /* channels per scale/zero group (divides D) */
    int bits;           /* 4 or 8 (codes), or 16 (fp16 values; kv_bits 0 is stored as 16) */
    int code_row_bytes; /* bytes of one slot's codes */
    int sz_row_bytes;   /* bytes of one slot's (scale, zero) pairs; 0 for fp16 */
    size_t sz_offset;   /* byte offset of the scale rows inside a head tile */
    size_t head_tile_bytes;
    size_t layer_bytes; /* n_pages * 2 * Hkv * head_tile_bytes */
    size_t total_bytes; /* n_layer * layer_bytes */
} comet_cuda_kv_layout;

static inline size_t comet_cuda_kv_round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* The layout for the given pool shape. kv_bits 0 and 16 give fp16 storage; G <= 0 means D.
 * The caller checks the shape (D % 8 == 0, G divides D, bits in {0, 4, 8, 16}). */
static inline comet_cuda_kv_layout comet_cuda_kv_layout_make(int n_layer, int n_pages, int P,
                                                             int Hkv, int D, int kv_bits, int G) {
    comet_cuda_kv_layout L;
    L.n_layer = n_layer, L.n_pages = n_pages, L.P = P, L.Hkv = Hkv, L.D = D;
    L.G = G > 0 ? G : D;
    L.bits = kv_bits == 4 || kv_bits == 8 ? kv_bits : 16;
    L.code_row_bytes = L.bits == 4 ? D / 2 : L.bits == 8 ? D : 2 * D;
    L.sz_row_bytes = L.bits == 16 ? 0 : (D / L.G) * 4;
    L.sz_offset = comet_cuda_kv_round16((size_t)P * (size_t)L.code_row_bytes);
    L.head_tile_bytes = L.sz_offset + comet_cuda_kv_round16((size_t)P * (size_t)L.sz_row_bytes);
    L.layer_bytes = (size_t)n_pages * 2 * (size_t)Hkv * L.head_tile_bytes;
    L.total_bytes = (size_t)n_layer * L.layer_bytes;
    return L;
}

/* ---- the step's batch on the device, as the RoPE / KV / attention kernels read it ---- */

/* Tokens per attention tile (a tile never spans two sequences; see tiles below). */
#define COMET_CUDA_ATTN_TILE 16
/* Fewest tokens of one sequence in a step that take a tensor-core prefill kernel (a prefill
 * chunk; shorter chunks and decode tokens keep the fp32 kernels): one tile's worth. */
#define COMET_CUDA_ATTN_MMA_MIN_TOKENS 16

typedef struct comet_cuda_step_view {
    int n_tokens, n_seqs;        /* T, S */
    const int32_t *positions;    /* [T] */
    const int32_t *token_indptr; /* [S + 1] */
    const int32_t *page_indptr;  /* [S + 1] */
    const int32_t *page_indices; /* [page_indptr[S]] */
    const int32_t *tiles;        /* [n_tiles, 2]: (first token, sequence) of each run of up
                                    * to COMET_CUDA_ATTN_TILE consecutive tokens of one
                                    * sequence, covering every token once */
    int n_tiles;
    int max_kv_len;      /* the longest sequence after the append (host value) */
    int min_q_len;       /* the fewest tokens a sequence has in the step (host value; 0:
                          * unknown): at ATT_MMA_MIN_TOKENS or more every chunk takes the
                          * tensor-core prefill kernel, whose CTAs then plan the key splits,
                          * and the fp32 kernel is not launched */
    int mma3_min_ctas;   /* attn_mma 3 takes attn_mma3_kernel only in steps with more of its
                          * CTAs than this (the backend's default: the SMs, where
                          * attn_mma2_kernel's CTAs no longer fit one wave); 0: in every step */
    int batch_invariant; /* the backend's batch_invariant (backend.h): attention
                                    * then takes the tile kernel over fixed key spans */
    int attn_mma;        /* prefill chunks' attention: 3 (the backend's default where an
                          * SM holds two of its CTAs: sm_90) the two-CTAs-an-SM kernel of INT4
                          * caches (attn_mma3_kernel) where it applies, else as 2; 2 (the
                          * default elsewhere) the pipelined tensor-core kernel
                          * (attn_mma2_kernel) where it applies, else the first one
                          * (attn_mma_kernel); 1 attn_mma_kernel always; 0 the fp32 kernel
                          * (COMET_CUDA_ATTN_MMA=N asks for N) */
} comet_cuda_step_view;

#endif
