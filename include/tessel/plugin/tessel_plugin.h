/* tessel plugin ABI — the only header a sparse-attention plugin includes.
 *
 * Pure C (C99 and C++ compatible). A plugin is a shared library exporting one entry symbol:
 *
 *   tessel_status tessel_plugin_init(const tessel_host_api* host, tessel_plugin_backend* backend,
 *                                    tessel_error* error);
 *
 * The host passes its API table (`host`: dense and block-sparse attention kernels, logging,
 * version) and a zeroed backend table whose `struct_size` says how many bytes the host reserved.
 * The plugin fills the table — first `abi_version` = TESSEL_PLUGIN_ABI_VERSION (the version it
 * was compiled against), then `struct_size` = sizeof(tessel_plugin_backend), name, capabilities
 * and function pointers — and returns TESSEL_OK, or an error status with a message in `error`.
 * A library may export other entry points with the same signature; users name them as
 * "/path/libx.so:symbol".
 *
 * Compatibility rules (as ggml's and Vulkan's): both tables start with abi_version and
 * struct_size; tables are append-only — a new ABI version only adds fields at the end. The host
 * accepts plugins with 1 <= abi_version <= its own version and treats fields past the plugin's
 * struct_size as absent. A plugin must check host->abi_version / host->struct_size before using a
 * host field newer than version 1 (TESSEL_HOST_HAS). A plugin built for a newer ABI than the host's
 * is refused with an error naming both versions.
 *
 * Version 2 adds the caller's execution context: the plugin table's forward_with_context (used
 * instead of forward when set) receives a tessel_exec_context (the CUDA stream to enqueue on, the
 * caller's workspace, the CPU thread count and the denoising step), and the host table's
 * attention_with_context / block_sparse_attention_with_context run the host kernels under such a
 * context. A version-1 plugin keeps working: its forward runs on the legacy default stream and
 * gets the step through update_step.
 *
 * Nothing else crosses: tensors are plain structs of pointers and sizes, errors are status codes
 * plus a NUL-terminated message, no C++ type and no exception (a plugin written in C++ must catch
 * everything inside its functions). All tensors are BSHD (batch, seq, heads, head_dim), strides in
 * elements; lse is float32 (batch, heads, seq_q), natural log, scale included.
 */
#ifndef TESSEL_PLUGIN_TESSEL_PLUGIN_H_
#define TESSEL_PLUGIN_TESSEL_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TESSEL_PLUGIN_ABI_VERSION 2u
#define TESSEL_PLUGIN_ENTRY_SYMBOL "tessel_plugin_init"
#define TESSEL_MAX_DIMS 8
#define TESSEL_ERROR_MESSAGE_SIZE 1024

#if defined(_WIN32)
#define TESSEL_PLUGIN_EXPORT __declspec(dllexport)
#else
#define TESSEL_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* True when a table of `table->struct_size` bytes contains `field`. */
#define TESSEL_HOST_HAS(table, field) \
  ((table)->struct_size >= offsetof(tessel_host_api, field) + sizeof((table)->field))

typedef enum tessel_status {
  TESSEL_OK = 0,
  TESSEL_ERROR_INVALID_ARGUMENT = 1, /* bad shapes, dtypes, spec fields */
  TESSEL_ERROR_UNSUPPORTED = 2,      /* valid, but this backend cannot run it */
  TESSEL_ERROR_OUT_OF_MEMORY = 3,
  TESSEL_ERROR_ABI = 4,              /* the other side's ABI version cannot be served */
  TESSEL_ERROR_INTERNAL = 5
} tessel_status;

/* Filled by whoever returns a status other than TESSEL_OK. */
typedef struct tessel_error {
  char message[TESSEL_ERROR_MESSAGE_SIZE];
} tessel_error;

/* Same numbering as tessel::DType / tessel::DeviceType. */
typedef enum tessel_dtype {
  TESSEL_DTYPE_F32 = 0, TESSEL_DTYPE_F16 = 1, TESSEL_DTYPE_BF16 = 2,
  TESSEL_DTYPE_F64 = 3, TESSEL_DTYPE_I32 = 4, TESSEL_DTYPE_U8 = 5
} tessel_dtype;
typedef enum tessel_device_type { TESSEL_DEVICE_CPU = 0, TESSEL_DEVICE_CUDA = 1 } tessel_device_type;

/* Same numbering as tessel::PatternType. */
typedef enum tessel_pattern_type {
  TESSEL_PATTERN_DENSE = 0, TESSEL_PATTERN_BLOCK_SPARSE = 1, TESSEL_PATTERN_SLIDING_WINDOW = 2,
  TESSEL_PATTERN_SPATIAL_AWARE = 3, TESSEL_PATTERN_DYNAMIC_TOPK = 4, TESSEL_PATTERN_THRESHOLD = 5,
  TESSEL_PATTERN_RADIAL = 6, TESSEL_PATTERN_LOCAL = 7, TESSEL_PATTERN_ARROW = 8,
  TESSEL_PATTERN_COMPOSITE = 9, TESSEL_PATTERN_HEAD_CLASSIFY = 10
} tessel_pattern_type;

/* Same numbering as tessel::ModuleType. */
typedef enum tessel_module_type {
  TESSEL_MODULE_DIT_SELF = 0, TESSEL_MODULE_DIT_CROSS = 1, TESSEL_MODULE_DIT_JOINT = 2,
  TESSEL_MODULE_LLM_PREFILL = 3, TESSEL_MODULE_LLM_DECODE = 4
} tessel_module_type;

/* Capability bit masks: bit (1u << enum value). */
#define TESSEL_BIT(value) (1u << (unsigned)(value))

typedef enum tessel_log_level {
  TESSEL_LOG_DEBUG = 0, TESSEL_LOG_INFO = 1, TESSEL_LOG_WARNING = 2, TESSEL_LOG_ERROR = 3
} tessel_log_level;

typedef struct tessel_tensor {
  void* data;
  int32_t dtype;        /* tessel_dtype */
  int32_t device_type;  /* tessel_device_type */
  int32_t device_index;
  int32_t ndim;         /* <= TESSEL_MAX_DIMS */
  int64_t shape[TESSEL_MAX_DIMS];
  int64_t strides[TESSEL_MAX_DIMS]; /* in elements */
} tessel_tensor;

/* A BSR block mask (docs/architecture.md): rows (mask_batch, mask_heads, q_blocks) flattened row-major,
 * indptr has rows + 1 int32 entries, indices the sorted, unique kept kv-block ids of each row.
 * mask_batch is 1 or B; mask_heads is 1, H_kv or H_q. Arrays live on device_type/device_index. */
typedef struct tessel_block_mask {
  const int32_t* indptr;
  const int32_t* indices;
  int64_t mask_batch, mask_heads, q_blocks, kv_blocks;
  int64_t block_q, block_kv;
  int64_t seq_q, seq_kv;
  int32_t device_type, device_index;
} tessel_block_mask;

typedef struct tessel_attention_options {
  float scale;          /* 0: 1/sqrt(head_dim) */
  int32_t causal;       /* bottom-right aligned when seq_q != seq_kv */
  int64_t window_left;  /* tokens, -1: unbounded */
  int64_t window_right;
} tessel_attention_options;

typedef struct tessel_spatial_layout {
  int64_t frames, height, width, patch_size; /* latent pixels; tokens = frames*(h/p)*(w/p) */
  int32_t ordering;                          /* 0 raster, 1 hilbert, 2 z_curve */
} tessel_spatial_layout;

/* The PatternSpec, flattened. Optional integers are -1 when absent, optional reals NaN. */
typedef struct tessel_pattern_spec {
  int32_t type; /* tessel_pattern_type */
  int64_t block_q, block_kv;
  const tessel_block_mask* block_mask; /* block_sparse: CPU arrays, or NULL */
  const uint8_t* sub_block_mask;       /* (nnz, block_q, block_kv) or NULL */
  int64_t window_size;
  int32_t has_spatial_layout;
  tessel_spatial_layout spatial_layout;
  int64_t spatial_radius;
  double decay_factor;
  int64_t local_window_frames;
  double topk_ratio;
  double threshold;
  int64_t stride;
  int64_t num_image_tokens, num_text_tokens;
  int32_t text_first, cross_dense;
  const struct tessel_pattern_spec* i2i_pattern; /* arrow inner pattern, or NULL */
  const struct tessel_pattern_spec* children;    /* composite */
  int32_t num_children;
  int32_t composite_op;                          /* 0 union, 1 intersection */
  int32_t keep_diagonal;
  int64_t sink_blocks;
  int32_t keep_text;
  int64_t current_step, total_steps;
  const char* const* option_keys;   /* backend options, num_options pairs */
  const char* const* option_values;
  int32_t num_options;
} tessel_pattern_spec;

/* The shapes a plan is made for. */
typedef struct tessel_plan_request {
  int32_t module_type; /* tessel_module_type */
  int64_t batch, num_qo_heads, num_kv_heads, head_dim, seq_q, seq_kv;
  int32_t dtype, device_type, device_index;
} tessel_plan_request;

/* This step's schedule values (update_step). */
typedef struct tessel_step_info {
  int64_t step, total_steps;
  double topk_ratio; /* density the schedule asks for at this step, (0, 1] */
} tessel_step_info;

/* Where one forward call runs (ABI version 2). Read fields only within struct_size. */
typedef struct tessel_exec_context {
  uint32_t struct_size;      /* sizeof(tessel_exec_context) in the host */
  int32_t device_type;       /* tessel_device_type of the stream and the workspace */
  int32_t device_index;
  int32_t num_threads;       /* CPU threads for CPU work, 0 = the default */
  void* stream;              /* cudaStream_t to enqueue CUDA work on; NULL = legacy default stream */
  void* workspace;           /* scratch memory the caller owns for this call, or NULL */
  uint64_t workspace_bytes;  /* its size; the host kernels called with this context use it too */
  /* The denoising step of this call (the host calls no update_step for a version-2 plugin). */
  int64_t step;              /* -1: no step */
  int64_t total_steps;
  int64_t layer;
  int32_t cfg_branch;
  double density;            /* the schedule's density for the step, NaN when unset */
} tessel_exec_context;

typedef struct tessel_forward_stats {
  double density;     /* blocks computed / all blocks */
  double estimate_ms; /* time spent choosing blocks */
} tessel_forward_stats;

/* ---- what the host offers the plugin (read-only) ---- */
typedef struct tessel_host_api {
  uint32_t abi_version;  /* the host's TESSEL_PLUGIN_ABI_VERSION */
  uint32_t struct_size;  /* sizeof(tessel_host_api) in the host */
  const char* host_version; /* "0.1.0" */
  void (*log)(int32_t level, const char* message);
  /* Dense attention: q (B,Sq,Hq,D), k/v (B,Skv,Hkv,D), out like q, lse (B,Hq,Sq) fp32 or NULL. */
  tessel_status (*attention)(const tessel_tensor* q, const tessel_tensor* k, const tessel_tensor* v,
                             const tessel_tensor* out, const tessel_tensor* lse,
                             const tessel_attention_options* options, tessel_error* error);
  /* Block-sparse attention over a BSR mask (validated by the host; CPU or device arrays matching
   * the tensors' device). Token-level options still apply inside kept blocks. */
  tessel_status (*block_sparse_attention)(const tessel_tensor* q, const tessel_tensor* k, const tessel_tensor* v,
                                          const tessel_block_mask* mask, const tessel_tensor* out,
                                          const tessel_tensor* lse, const tessel_attention_options* options,
                                          tessel_error* error);
  /* Checks a CPU BSR mask (sorted, unique, in range, indptr consistent). */
  tessel_status (*validate_block_mask)(const tessel_block_mask* mask, tessel_error* error);
  /* ---- ABI version 2 (check TESSEL_HOST_HAS) ---- */
  /* attention and block_sparse_attention under `ctx` (its stream, threads and workspace; NULL =
   * the default context). */
  tessel_status (*attention_with_context)(const tessel_exec_context* ctx, const tessel_tensor* q,
                                          const tessel_tensor* k, const tessel_tensor* v, const tessel_tensor* out,
                                          const tessel_tensor* lse, const tessel_attention_options* options,
                                          tessel_error* error);
  tessel_status (*block_sparse_attention_with_context)(const tessel_exec_context* ctx, const tessel_tensor* q,
                                                       const tessel_tensor* k, const tessel_tensor* v,
                                                       const tessel_block_mask* mask, const tessel_tensor* out,
                                                       const tessel_tensor* lse,
                                                       const tessel_attention_options* options, tessel_error* error);
} tessel_host_api;

/* ---- what the plugin provides (filled by the entry point) ---- */
typedef struct tessel_plugin_backend {
  uint32_t abi_version; /* the plugin's TESSEL_PLUGIN_ABI_VERSION; must be first */
  uint32_t struct_size; /* sizeof(tessel_plugin_backend) in the plugin */
  const char* name;     /* registry name; static storage */
  const char* description;
  uint32_t pattern_mask; /* TESSEL_BIT(tessel_pattern_type) ... */
  uint32_t module_mask;  /* TESSEL_BIT(tessel_module_type) ... */
  uint32_t device_mask;  /* TESSEL_BIT(tessel_device_type) ... */
  int32_t score;         /* auto-selection rank (higher wins; negative: never automatic) */
  void* user_data;       /* passed back to every function below */

  /* Required. Builds a plan for the pattern and shapes; *plan receives an opaque handle. */
  tessel_status (*plan)(void* user_data, const tessel_pattern_spec* spec, const tessel_plan_request* request,
                        void** plan, tessel_error* error);
  /* Optional (NULL: nothing to do per step). */
  tessel_status (*update_step)(void* user_data, void* plan, const tessel_step_info* step, tessel_error* error);
  /* Required unless forward_with_context is set (ABI 2). Writes out (and lse when not NULL); stats
   * may be NULL. */
  tessel_status (*forward)(void* user_data, void* plan, const tessel_tensor* q, const tessel_tensor* k,
                           const tessel_tensor* v, const tessel_tensor* out, const tessel_tensor* lse,
                           tessel_forward_stats* stats, tessel_error* error);
  /* Required. Frees a plan. */
  void (*destroy_plan)(void* user_data, void* plan);
  /* Optional: rejects a config (the validated SparseAttnConfig as JSON, in its nested form:
   * {"backend", "geometry": {...}, "pattern": {...}, "selection": {...}, "schedule",
   * "warmup": {...}, "options": {...}}). */
  tessel_status (*validate_config)(void* user_data, const char* config_json, tessel_error* error);
  /* Optional: called once before the library is unloaded. */
  void (*shutdown)(void* user_data);
  /* ---- ABI version 2 ---- */
  /* Optional: forward under the caller's execution context. When set, the host calls it instead
   * of forward (which may then be NULL) and never calls update_step: the step arrives in ctx. A
   * plan may be used by several threads at once through this function, so it must not modify
   * the plan. */
  tessel_status (*forward_with_context)(void* user_data, void* plan, const tessel_exec_context* ctx,
                                        const tessel_tensor* q, const tessel_tensor* k, const tessel_tensor* v,
                                        const tessel_tensor* out, const tessel_tensor* lse,
                                        tessel_forward_stats* stats, tessel_error* error);
} tessel_plugin_backend;

typedef tessel_status (*tessel_plugin_init_fn)(const tessel_host_api* host, tessel_plugin_backend* backend,
                                               tessel_error* error);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_PLUGIN_TESSEL_PLUGIN_H_ */
