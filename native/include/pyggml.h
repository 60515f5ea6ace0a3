/* pyggml.h — the whole C ABI of libpyggml (C11, no CPython API; loaded with ctypes).
 *
 * Conventions
 *   - ggml dimension order: ne[0] is the innermost (contiguous) dimension.
 *   - Every entry point that takes input validates it and returns a pg_status (0 = ok);
 *     the library never calls exit() or abort() on input.
 *   - Enum values are shared with pyggml/types.py; tests/test_types.py parses this header and
 *     checks that both sides agree. Change them in both places or not at all.
 */
#ifndef PYGGML_H
#define PYGGML_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PG_VERSION_STRING "0.1.0"
/* Binary interface version, checked by pyggml/_native.py when it loads the library (with
 * sizeof(pg_tensor)). Bump it whenever the Python side could misread the library: a pg_tensor
 * field, a pg_status value or an entry point's prototype changes. */
#define PG_ABI_VERSION   2
#define PG_MAX_DIMS      4
#define PG_MAX_SRC       10
#define PG_MAX_OP_PARAMS 16   /* int32 slots (64 bytes), floats stored bit-cast */
#define PG_MAX_NAME      48

/* ---- status codes ----------------------------------------------------------------------- */
typedef enum pg_status {
    PG_OK               = 0,
    PG_ERR_INVALID_ARG  = 1,   /* NULL pointer, negative size, length not a multiple of block */
    PG_ERR_UNSUPPORTED  = 2,   /* type/op/path not implemented or not available on this CPU   */
    PG_ERR_NOMEM        = 3,
    PG_ERR_INTERNAL     = 4,   /* a bug in the library, never the input's fault              */
    PG_ERR_ABORTED      = 5,   /* the eval callback asked to stop (ggml: GGML_STATUS_ABORTED) */
    PG_ERR_CLOSED       = 6,   /* a thread pool that was freed (or never created) was passed  */
} pg_status;

/* ---- tensor types (ids as stored in GGUF files) ------------------------------------------ */
typedef enum pg_type {
    PG_TYPE_F32     = 0,
    PG_TYPE_F16     = 1,
    PG_TYPE_Q4_0    = 2,
    PG_TYPE_Q4_1    = 3,
    PG_TYPE_Q5_0    = 6,
    PG_TYPE_Q5_1    = 7,
    PG_TYPE_Q8_0    = 8,
    PG_TYPE_Q8_1    = 9,
    PG_TYPE_Q2_K    = 10,
    PG_TYPE_Q3_K    = 11,
    PG_TYPE_Q4_K    = 12,
    PG_TYPE_Q5_K    = 13,
    PG_TYPE_Q6_K    = 14,
    PG_TYPE_Q8_K    = 15,
    PG_TYPE_IQ2_XXS = 16,
    PG_TYPE_IQ2_XS  = 17,
    PG_TYPE_IQ3_XXS = 18,
    PG_TYPE_IQ1_S   = 19,
    PG_TYPE_IQ4_NL  = 20,
    PG_TYPE_IQ3_S   = 21,
    PG_TYPE_IQ2_S   = 22,
    PG_TYPE_IQ4_XS  = 23,
    PG_TYPE_I8      = 24,
    PG_TYPE_I16     = 25,
    PG_TYPE_I32     = 26,
    PG_TYPE_I64     = 27,
    PG_TYPE_F64     = 28,
    PG_TYPE_IQ1_M   = 29,
    PG_TYPE_BF16    = 30,
    PG_TYPE_TQ1_0   = 34,
    PG_TYPE_TQ2_0   = 35,
    PG_TYPE_MXFP4   = 39,
    PG_TYPE_NVFP4   = 40,
    PG_TYPE_Q1_0    = 41,
    PG_TYPE_COUNT   = 42,
} pg_type;

/* ---- ops (our own numbering; values shared with pyggml.types.Op) --------------------------- */
typedef enum pg_op {
    PG_OP_NONE          = 0,
    PG_OP_DUP           = 1,
    PG_OP_ADD           = 2,
    PG_OP_SUB           = 3,
    PG_OP_MUL           = 4,
    PG_OP_DIV           = 5,
    PG_OP_SQR           = 6,
    PG_OP_SQRT          = 7,
    PG_OP_SCALE         = 8,
    PG_OP_NORM          = 9,
    PG_OP_RMS_NORM      = 10,
    PG_OP_MUL_MAT       = 11,
    PG_OP_CPY           = 12,
    PG_OP_CONT          = 13,
    PG_OP_RESHAPE       = 14,
    PG_OP_VIEW          = 15,
    PG_OP_PERMUTE       = 16,
    PG_OP_TRANSPOSE     = 17,
    PG_OP_GET_ROWS      = 18,
    PG_OP_SET_ROWS      = 19,
    PG_OP_DIAG_MASK_INF = 20,
    PG_OP_SOFT_MAX      = 21,
    PG_OP_ROPE          = 22,
    PG_OP_CONCAT        = 23,
    PG_OP_GELU          = 24,
    PG_OP_SILU          = 25,
    PG_OP_FLASH_ATTN_EXT = 26,
    PG_OP_TANH          = 27,
    PG_OP_MUL_MAT_ID    = 28,
    PG_OP_ARGSORT       = 29,
    PG_OP_SUM_ROWS      = 30,
    PG_OP_CLAMP         = 31,
    PG_OP_SIGMOID       = 32,
    /* 48..: recurrent layers (src/ops_ssm.c; values apart so other new ops fit below) */
    PG_OP_SSM_CONV      = 48,
    PG_OP_GATED_DELTA_NET = 49,
    PG_OP_SOFTPLUS      = 50,   /* log(1 + exp(x)), x above 20 as is (ggml's) */
    PG_OP_COUNT         = 51,
} pg_op;

/* rope modes (op_params[2]), as ggml */
#define PG_ROPE_MODE_NORMAL 0
#define PG_ROPE_MODE_NEOX   2

/* argsort orders (op_params[0]), as ggml_sort_order */
#define PG_SORT_ORDER_ASC  0
#define PG_SORT_ORDER_DESC 1

/* tensor flags, as ggml */
#define PG_TENSOR_FLAG_INPUT   1
#define PG_TENSOR_FLAG_OUTPUT  2
#define PG_TENSOR_FLAG_PARAM   4
#define PG_TENSOR_FLAG_LOSS    8
#define PG_TENSOR_FLAG_COMPUTE 16

/* ---- CPU features and kernel paths ------------------------------------------------------- */
typedef enum pg_cpu_feature {
    PG_CPU_SSE3        = 1u << 0,
    PG_CPU_AVX         = 1u << 1,
    PG_CPU_AVX2        = 1u << 2,
    PG_CPU_FMA         = 1u << 3,
    PG_CPU_F16C        = 1u << 4,
    PG_CPU_AVX512F     = 1u << 5,
    PG_CPU_AVX512BW    = 1u << 6,
    PG_CPU_AVX512VL    = 1u << 7,
    PG_CPU_AVX512VNNI  = 1u << 8,
    PG_CPU_AMXINT8     = 1u << 9,    /* AMX-TILE + AMX-INT8, tile state granted by the OS      */
    PG_CPU_AVXVNNI     = 1u << 10,   /* AVX-VNNI: VPDPBUSD / VPDPWSSD on ymm (VEX), no AVX-512 */
    PG_CPU_NEON        = 1u << 16,
    PG_CPU_DOTPROD     = 1u << 17,
    PG_CPU_FP16        = 1u << 18,
} pg_cpu_feature;

typedef enum pg_path {
    PG_PATH_SCALAR = 0,
    PG_PATH_AVX2   = 1,   /* AVX2 + FMA + F16C */
    PG_PATH_AVX512 = 2,   /* AVX2 path plus AVX-512 kernels where present */
    PG_PATH_NEON   = 3,   /* NEON, with dotprod kernels where the CPU has them */
    PG_PATH_AMX    = 4,   /* AVX-512 path plus AMX int8 tile gemms for prompt-sized MUL_MAT */
} pg_path;
#define PG_PATH_COUNT 5

const char *pg_version(void);
/* PG_ABI_VERSION of the build. */
int32_t     pg_abi_version(void);
/* Bit set of pg_cpu_feature detected at load time on the running CPU. */
uint32_t    pg_cpu_features(void);
/* Kernel path in use. Chosen at load time: the best one the CPU has, or the one named by the
 * environment variable PYGGML_CPU_PATH (scalar|avx2|avx512|amx|neon) when the CPU supports it. */
int32_t     pg_cpu_path(void);
/* Force a path; PG_ERR_UNSUPPORTED if this CPU or this build cannot run it. */
int32_t     pg_set_cpu_path(int32_t path);
/* Whether this build contains kernels for a path (x86 builds: scalar/avx2/avx512/amx; arm:
 * neon). */
int32_t     pg_path_compiled(int32_t path);

/* ---- the flat tensor struct of the graph executor ---------------------------------------- */
typedef struct pg_tensor {
    int32_t type;                        /* pg_type                                           */
    int32_t op;                          /* pg_op                                             */
    int64_t ne[PG_MAX_DIMS];             /* elements per dim, ne[0] innermost                 */
    int64_t nb[PG_MAX_DIMS];             /* byte strides                                      */
    int32_t op_params[PG_MAX_OP_PARAMS];
    int32_t src[PG_MAX_SRC];             /* indices into the same array, -1 = none            */
    int32_t flags;
    int32_t pad_;
    void   *data;                        /* filled from the allocator's plan                  */
    char    name[PG_MAX_NAME];
} pg_tensor;

/* Size of pg_tensor in bytes (the Python side checks its numpy mirror against it at load). */
size_t pg_tensor_struct_size(void);
/* Byte offsets of pg_tensor's fields in declaration order (type, op, ne, nb, op_params, src,
 * flags, pad_, data, name) into offsets[0..n_max); returns the number of fields (10). */
int32_t pg_tensor_field_offsets(int64_t *offsets, int32_t n_max);

/* ---- quantized formats (src/quants_api.c) -------------------------------------------------
 * Row-level access to the per-type kernels of the current path (pg_cpu_path). `n` counts
 * elements and must be a multiple of the type's block size; buffers hold whole blocks.
 * Every call returns PG_OK, PG_ERR_INVALID_ARG (NULL, n < 0, n not a multiple of the block
 * size) or PG_ERR_UNSUPPORTED (unknown type, or no kernel of that kind for the type). */

/* Elements per block and bytes per block of a type id the library knows; 0 for unknown ids. */
int32_t pg_type_block_size(int32_t type);
int32_t pg_type_size(int32_t type);
/* Reference quantizer (bit-exact with the gguf package / ggml's quantize_row_*_ref). */
int32_t pg_quantize_row(int32_t type, const float *x, void *y, int64_t n);
/* Fast activation quantizer (the one matmul uses for vec_dot_type); equals the reference
 * bit for bit for the types this library implements (see quants_legacy_*.c). */
int32_t pg_quantize_row_act(int32_t type, const float *x, void *y, int64_t n);
int32_t pg_dequantize_row(int32_t type, const void *x, float *y, int64_t n);
/* The type the second operand of pg_vec_dot must be in; -1 if `type` has no dot kernel. */
int32_t pg_vec_dot_type(int32_t type);
/* *s = dot(x, y) over n elements; x of `type`, y of pg_vec_dot_type(type). */
int32_t pg_vec_dot(int32_t type, int64_t n, float *s, const void *x, const void *y);
/* Scratch bytes pg_matvec needs for a row of ne0 activations of `type`'s vec_dot_type. */
size_t  pg_matvec_scratch_size(int32_t type, int64_t ne0);
/* Single-threaded out[r] = dot(w row r, x) for r < nrows (for benchmarks and tests): x (ne0
 * floats) is quantized once to vec_dot_type into scratch (at least pg_matvec_scratch_size
 * bytes), then each weight row (row_stride bytes apart) is dotted with it, by the kernels decode's
 * MUL_MAT uses (eight rows at a time where the type has a vec_dot8; vec_dot's bits). */
int32_t pg_matvec(int32_t type, int64_t ne0, int64_t nrows, const void *w, size_t row_stride,
                  const float *x, float *out, void *scratch, size_t scratch_size);
/* Memory-bandwidth probe for benchmarks (src/bench.c): reads nbytes at p with the widest loads
 * of the current path and returns a checksum (the sum mod 2^64 of the 8-byte words of the
 * 64-byte-aligned middle plus the bytes of the unaligned head and tail). */
uint64_t pg_bench_read(const void *p, size_t nbytes);

/* ---- CPU graph executor ------------------------------------------------------------------
 * Python marshals a graph (or one split of it) once into an array of pg_tensor (leafs and nodes;
 * src[] are indices into that array) plus `order`, the indices of the nodes to run in order.
 * View ops and NONE are skipped. Kernels never allocate: scratch comes from `work`, sized by
 * pg_graph_work_size for the largest n_threads the graph will run with. */
#define PG_MAX_THREADS 256

typedef struct pg_threadpool pg_threadpool;

/* Called after each node when set: return non-zero to stop the graph (PG_ERR_ABORTED). */
typedef int32_t (*pg_eval_cb)(int32_t node_index, const pg_tensor *node, void *user);

/* A pool handle stays safe to pass after pg_threadpool_free: compute refuses it with
 * PG_ERR_CLOSED, a second free is a no-op, n_threads gives 0 (live pools are looked up by
 * address, never read through a stale pointer; callers should still drop freed handles, since
 * a later pool may get the same address). Computes on one pool are serialized; free waits for
 * a compute in flight. */
pg_threadpool *pg_threadpool_new(int32_t n_threads);   /* NULL if n_threads out of [1, 256] */
void           pg_threadpool_free(pg_threadpool *tp);
int32_t        pg_threadpool_n_threads(const pg_threadpool *tp);   /* 0 if not a live pool */

/* Checks every node of `order`: op known and supported for its types and layouts, sources
 * present, shapes consistent, data non-NULL. On failure returns PG_ERR_INVALID_ARG or
 * PG_ERR_UNSUPPORTED and sets *bad_node to the index (into t) of the first bad node. */
int32_t pg_graph_validate(const pg_tensor *t, int32_t n_tensors, const int32_t *order,
                          int32_t n_nodes, int32_t *bad_node);
/* Whether one node (index i of t) can be computed by this library; reason gets a short message. */
int32_t pg_node_supported(const pg_tensor *t, int32_t n_tensors, int32_t i, char *reason,
                          size_t reason_size);
/* Bytes of scratch the graph needs with n_threads threads. */
int32_t pg_graph_work_size(const pg_tensor *t, int32_t n_tensors, const int32_t *order,
                           int32_t n_nodes, int32_t n_threads, size_t *work_size);
/* Validates, then runs the nodes in order with n_threads threads of tp (tp may be NULL for one
 * thread; a freed tp gives PG_ERR_CLOSED). *bad_node is set on failure (-1 if no node is at
 * fault). */
int32_t pg_graph_compute(pg_tensor *t, int32_t n_tensors, const int32_t *order, int32_t n_nodes,
                         pg_threadpool *tp, int32_t n_threads, void *work, size_t work_size,
                         pg_eval_cb cb, void *cb_user, int32_t *bad_node);
/* pg_graph_compute without the per-node validation, for a prepared plan computed again (decode:
 * every token): t and order must be unchanged since pg_graph_validate (or pg_graph_work_size)
 * accepted them — the caller validates once per plan and again after changing any field (data
 * addresses included). The work buffer's size is still checked against the graph, and the
 * kernels' checks of data (row and expert ids) still report a bad node. Qwen 1.5B's decode graph
 * (874 nodes): 35 us of validation a token saved. */
int32_t pg_graph_compute_validated(pg_tensor *t, int32_t n_tensors, const int32_t *order,
                                   int32_t n_nodes, pg_threadpool *tp, int32_t n_threads,
                                   void *work, size_t work_size, pg_eval_cb cb, void *cb_user,
                                   int32_t *bad_node);
/* The executor's schedule (graph.c) for the whole process: mode 0 a barrier after every node;
 * 1 barriers only where a node needs another thread's results, and element-wise nodes after a
 * decode MUL_MAT fused into it; 2 (the default) also a thread early at a barrier prefetching its
 * next weight rows into L2. Every mode gives the same bits. For A/B measurements and tests; an
 * eval callback runs its compute in mode 0. */
void    pg_graph_set_schedule(int32_t mode);
/* How many barriers (between nodes) and fused nodes a compute of the graph takes. */
int32_t pg_graph_schedule_stats(pg_tensor *t, int32_t n_tensors, const int32_t *order,
                                int32_t n_nodes, int32_t *n_barriers, int32_t *n_fused);

/* A kept plan: a marshalled graph (t, order: borrowed, they must outlive the plan) computed
 * again and again with one schedule and work size, made on its first compute instead of per
 * compute. The caller validates t and order first (pg_graph_validate) and afterwards changes no
 * field of t but the data addresses (after which it validates again); a compute whose tensors'
 * addresses differ from those the schedule was made for makes a new one first. Computes of one
 * plan must not overlap (a plan is computed with one pool, which serializes them). Results are
 * bit-identical to pg_graph_compute_validated's. */
typedef struct pg_plan pg_plan;
pg_plan *pg_plan_new(pg_tensor *t, int32_t n_tensors, const int32_t *order, int32_t n_nodes);
void     pg_plan_free(pg_plan *p);
int32_t  pg_plan_compute(pg_plan *p, pg_threadpool *tp, int32_t n_threads, void *work,
                         size_t work_size, int32_t *bad_node);
/* pg_plan_compute, then each thread copies its share of the n floats at src (the graph's
 * output: logits) to dst, the columns a decode MUL_MAT of n columns gave it, so mostly what
 * it wrote itself and still holds in its cache; *not_finite: whether one is NaN or +inf. */
int32_t  pg_plan_compute_out(pg_plan *p, pg_threadpool *tp, int32_t n_threads, void *work,
                             size_t work_size, int32_t *bad_node, const float *src, float *dst,
                             int64_t n, int32_t *not_finite);
/* Schedules the plan has made so far (tests: kept while the graph is unchanged). */
int64_t  pg_plan_n_schedules(const pg_plan *p);

/* ---- KV cache ----------------------------------------------------------------------------- */
/* The attention mask of n_tokens new tokens over the first n_kv cells, fp16, row t at
 * out + t*row_stride: 0 where token t may attend cell j (bit seq_ids[t] of cell_seqs[j] set,
 * 0 <= cell_pos[j] <= pos[t], and pos[t] - cell_pos[j] < window when window > 0), -inf
 * elsewhere. cell_seqs: sequence bit sets (bit s = sequence s); seq_ids in [0, 63]. */
int32_t pg_kv_mask(const int64_t *cell_pos, const uint64_t *cell_seqs, int64_t n_kv,
                   const int32_t *pos, const int64_t *seq_ids, int64_t n_tokens,
                   int64_t window, uint16_t *out, int64_t row_stride);

/* ---- the decode step ----------------------------------------------------------------------
 * One token of one sequence through a kept decode graph in one call (pyggml/llm/context.py's
 * fast path): place the token in the KV cells, write the graph's inputs and mask rows, compute
 * the plan and copy out the logits, checking them. The placement is llama.cpp-style as
 * KVCache.place does it for one token: space 0 is the full space (the first free cell after
 * the sequence's last one, else the first free one), space 1 the optional sliding-window space
 * (first the sequence's cells at least `window` positions behind the token are let go, then
 * the cell seq·ring + pos mod ring, else the first free one). */
#define PG_STEP_MAX_UNDO 16

typedef struct {
    int32_t space;          /* 0 full, 1 sliding-window */
    int32_t pad_;
    int64_t cell, pos;      /* the cell and the position and sequence set it had before */
    uint64_t seqs;
} pg_cell_undo;

typedef struct {
    /* cell spaces: position (-1 empty) and sequence bit set of each cell */
    int64_t       *cell_pos[2];
    uint64_t      *cell_seqs[2];
    int64_t        n_cells[2];
    int32_t        n_spaces;        /* 1, or 2 with a sliding-window space */
    int32_t        pad0_;
    int64_t        ring, window;    /* space 1: cells per sequence's ring; the window */
    int64_t        kv_pad;          /* n_kv of a space: its last used cell + 1, rounded up */
    int64_t        n_kv[2];         /* the graph's n_kv per space (others: PG_STEP_OTHER_GRAPH) */
    /* the graph's inputs (NULL: the graph has none) */
    int32_t       *inp_tokens, *inp_pos, *inp_kv_idxs[2], *inp_out_ids;
    uint16_t      *mask[2];         /* masks with rows of mask_n_kv[m] cells of mask_space[m] */
    int64_t        mask_n_kv[2], mask_space[2], mask_window[2];
    /* the plan */
    pg_plan       *plan;
    pg_threadpool *tp;
    void          *work;
    size_t         work_size;
    int32_t        n_threads;
    int32_t        bad_node;        /* out: as pg_graph_compute's */
    const float   *logits;          /* the graph's output row */
    int64_t        n_vocab;
    int64_t        t_compute_ns;    /* out: added to: time in the compute */
    int64_t        n_undo;          /* out: the cells the step changed, for pg_decode_step_undo */
    pg_cell_undo   undo[PG_STEP_MAX_UNDO];
} pg_decode_step_args;

enum {
    PG_STEP_FALLBACK    = 100,   /* not for this step (no free cell where one is needed, too
                                    many cells to let go): nothing changed, take the general path */
    PG_STEP_OTHER_GRAPH = 101,   /* n_kv differs from the graph's: nothing changed */
    PG_STEP_NOT_FINITE  = 102,   /* computed, but a logit is NaN or +inf: the cells are undone */
};

/* PG_OK: placed, computed, logits copied to out (n_vocab floats); a->n_undo cells changed (the
 * caller may take them back with pg_decode_step_undo). PG_STEP_*: see above. A compute error
 * (pg_status, a->bad_node set): the cells are undone. */
int32_t pg_decode_step(pg_decode_step_args *a, int32_t token, int32_t pos, int32_t seq_id,
                       float *out);
/* Puts back the cells of the last pg_decode_step (in reverse order). */
void    pg_decode_step_undo(pg_decode_step_args *a);
size_t  pg_decode_step_args_size(void);

/* ---- hashing ------------------------------------------------------------------------------ */
/* FNV-1a 64 of n bytes (offset basis 0xcbf29ce484222325, prime 0x100000001b3): the content hash
 * of ggml's RPC tensor cache. */
uint64_t pg_fnv1a64(const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* PYGGML_H */
