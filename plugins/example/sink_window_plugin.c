/* Example out-of-tree tessel plugin: attention sinks + a local window.
 *
 * Built against tessel/plugin/tessel_plugin.h only (plain C, no tessel C++ headers, no link to
 * libtessel): it chooses blocks and lets the host's block-sparse kernel compute them. Plugin ABI
 * version 2: forward_with_context hands the caller's execution context (stream, workspace,
 * threads) on to the host kernel, so the work goes where the caller said.
 *
 * Backend "sink_window", pattern sliding_window. For q block i (tokens [i*bq, min((i+1)*bq, Sq)))
 * with shift = Skv - Sq, the mask keeps
 *   - the sink blocks: kv blocks [0, sinks), sinks = spec->sink_blocks if > 0, else the
 *     backend option "sinks" if given, else 1;
 *   - the window: every kv block holding a key j with
 *     i*bq + shift - window <= j <= min((i+1)*bq, Sq) - 1 + shift + window,
 *     window = spec->window_size (required).
 * One mask serves every batch and head (mask_batch = mask_heads = 1).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessel/plugin/tessel_plugin.h"

static const tessel_host_api* g_host = NULL;

typedef struct sink_window_plan {
  tessel_block_mask mask;
  int32_t* indptr;
  int32_t* indices;
  double density;
} sink_window_plan;

static tessel_status fail(tessel_error* error, tessel_status status, const char* message) {
  if (error) snprintf(error->message, sizeof error->message, "%s", message);
  return status;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static int64_t option_sinks(const tessel_pattern_spec* spec) {
  for (int32_t i = 0; i < spec->num_options; ++i)
    if (strcmp(spec->option_keys[i], "sinks") == 0) return strtoll(spec->option_values[i], NULL, 10);
  return 1;
}

static void destroy_plan(void* user_data, void* plan) {
  (void)user_data;
  sink_window_plan* p = (sink_window_plan*)plan;
  if (p == NULL) return;
  free(p->indptr);
  free(p->indices);
  free(p);
}

static tessel_status plan(void* user_data, const tessel_pattern_spec* spec, const tessel_plan_request* request,
                          void** plan_out, tessel_error* error) {
  (void)user_data;
  if (spec->window_size < 0)
    return fail(error, TESSEL_ERROR_INVALID_ARGUMENT, "sink_window: pattern.window_size is required (tokens, >= 0)");
  const int64_t sinks = spec->sink_blocks > 0 ? spec->sink_blocks : option_sinks(spec);
  if (sinks < 0) return fail(error, TESSEL_ERROR_INVALID_ARGUMENT, "sink_window: option sinks must be >= 0");
  const int64_t bq = spec->block_q, bkv = spec->block_kv;
  const int64_t sq = request->seq_q, skv = request->seq_kv, shift = skv - sq;
  const int64_t q_blocks = (sq + bq - 1) / bq, kv_blocks = (skv + bkv - 1) / bkv;

  sink_window_plan* p = (sink_window_plan*)calloc(1, sizeof *p);
  if (p == NULL) return fail(error, TESSEL_ERROR_OUT_OF_MEMORY, "sink_window: out of memory");
  p->indptr = (int32_t*)malloc(sizeof(int32_t) * (size_t)(q_blocks + 1));
  p->indices = (int32_t*)malloc(sizeof(int32_t) * (size_t)(q_blocks * kv_blocks + 1));
  if (p->indptr == NULL || p->indices == NULL) {
    destroy_plan(NULL, p);
    return fail(error, TESSEL_ERROR_OUT_OF_MEMORY, "sink_window: out of memory");
  }
  int64_t nnz = 0;
  p->indptr[0] = 0;
  for (int64_t i = 0; i < q_blocks; ++i) {
    const int64_t lo = max64(i * bq + shift - spec->window_size, 0);
    const int64_t hi = min64(min64((i + 1) * bq, sq) - 1 + shift + spec->window_size, skv - 1);
    for (int64_t j = 0; j < kv_blocks; ++j) {
      const int sink = j < sinks;
      const int window = lo <= hi && j >= lo / bkv && j <= hi / bkv;
      if (sink || window) p->indices[nnz++] = (int32_t)j;
    }
    p->indptr[i + 1] = (int32_t)nnz;
  }
  tessel_block_mask* m = &p->mask;
  m->indptr = p->indptr;
  m->indices = p->indices;
  m->mask_batch = 1;
  m->mask_heads = 1;
  m->q_blocks = q_blocks;
  m->kv_blocks = kv_blocks;
  m->block_q = bq;
  m->block_kv = bkv;
  m->seq_q = sq;
  m->seq_kv = skv;
  m->device_type = TESSEL_DEVICE_CPU; /* the host copies host masks to the device when needed */
  m->device_index = 0;
  p->density = (double)nnz / (double)(q_blocks * kv_blocks);
  tessel_status status = g_host->validate_block_mask(m, error);
  if (status != TESSEL_OK) {
    destroy_plan(NULL, p);
    return status;
  }
  *plan_out = p;
  return TESSEL_OK;
}

/* The plan is only read here: several threads may run one plan at once. */
static tessel_status forward_with_context(void* user_data, void* plan, const tessel_exec_context* ctx,
                                          const tessel_tensor* q, const tessel_tensor* k, const tessel_tensor* v,
                                          const tessel_tensor* out, const tessel_tensor* lse,
                                          tessel_forward_stats* stats, tessel_error* error) {
  (void)user_data;
  const sink_window_plan* p = (const sink_window_plan*)plan;
  tessel_status status = g_host->block_sparse_attention_with_context(ctx, q, k, v, &p->mask, out, lse, NULL, error);
  if (status == TESSEL_OK && stats != NULL) {
    stats->density = p->density;
    stats->estimate_ms = 0.0;
  }
  return status;
}

TESSEL_PLUGIN_EXPORT tessel_status tessel_plugin_init(const tessel_host_api* host, tessel_plugin_backend* backend,
                                                      tessel_error* error) {
  if (host == NULL || host->abi_version < 2 || !TESSEL_HOST_HAS(host, block_sparse_attention_with_context))
    return fail(error, TESSEL_ERROR_ABI, "sink_window: needs a tessel host with plugin ABI >= 2");
  g_host = host;
  backend->abi_version = TESSEL_PLUGIN_ABI_VERSION;
  backend->struct_size = (uint32_t)sizeof(tessel_plugin_backend);
  backend->name = "sink_window";
  backend->description = "attention sinks + local window (example plugin)";
  backend->pattern_mask = TESSEL_BIT(TESSEL_PATTERN_SLIDING_WINDOW);
  backend->module_mask = TESSEL_BIT(TESSEL_MODULE_DIT_SELF) | TESSEL_BIT(TESSEL_MODULE_DIT_JOINT) |
                         TESSEL_BIT(TESSEL_MODULE_LLM_PREFILL);
  backend->device_mask = TESSEL_BIT(TESSEL_DEVICE_CPU) | TESSEL_BIT(TESSEL_DEVICE_CUDA);
  backend->score = 5;
  backend->user_data = NULL;
  backend->plan = plan;
  backend->update_step = NULL;
  backend->forward = NULL; /* forward_with_context replaces it */
  backend->destroy_plan = destroy_plan;
  backend->validate_config = NULL;
  backend->shutdown = NULL;
  backend->forward_with_context = forward_with_context;
  return TESSEL_OK;
}
