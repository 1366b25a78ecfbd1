/* Two plugins for the ABI-compatibility tests, built from this one file as separate libraries:
 *
 *   CONTEXT_PLUGIN_V1  a version-1 plugin: abi_version 1 and the version-1 table size (everything
 *                      before forward_with_context), forward without a context, update_step.
 *                      Backend "context_v1".
 *   (default)          a version-2 plugin: forward_with_context only. Backend "context_v2". It
 *                      checks that the context carries the stream and workspace named by the
 *                      backend options "expect_stream" / "expect_workspace" (hexadecimal
 *                      addresses) and fails with a message otherwise; it reports the step's density
 *                      as its density.
 *
 * Both compute dense attention through the host (so the test knows the exact answer).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessel/plugin/tessel_plugin.h"

static const tessel_host_api* g_host = NULL;

typedef struct context_plan {
  unsigned long long expect_stream, expect_workspace;
  long long steps_seen; /* version 1: update_step calls */
} context_plan;

static tessel_status fail(tessel_error* error, const char* message) {
  if (error) snprintf(error->message, sizeof error->message, "%s", message);
  return TESSEL_ERROR_INVALID_ARGUMENT;
}

static unsigned long long option_address(const tessel_pattern_spec* spec, const char* key) {
  for (int32_t i = 0; i < spec->num_options; ++i)
    if (strcmp(spec->option_keys[i], key) == 0) return strtoull(spec->option_values[i], NULL, 16);
  return 0;
}

static tessel_status plan(void* user_data, const tessel_pattern_spec* spec, const tessel_plan_request* request,
                          void** plan_out, tessel_error* error) {
  (void)user_data;
  (void)request;
  context_plan* p = (context_plan*)calloc(1, sizeof *p);
  if (p == NULL) return fail(error, "context plugin: out of memory");
  p->expect_stream = option_address(spec, "expect_stream");
  p->expect_workspace = option_address(spec, "expect_workspace");
  *plan_out = p;
  return TESSEL_OK;
}

static void destroy_plan(void* user_data, void* plan) {
  (void)user_data;
  free(plan);
}

static void fill_common(tessel_plugin_backend* b, const char* name) {
  b->name = name;
  b->description = "plugin ABI compatibility fixture";
  b->pattern_mask = TESSEL_BIT(TESSEL_PATTERN_SLIDING_WINDOW);
  b->module_mask = TESSEL_BIT(TESSEL_MODULE_DIT_SELF);
  b->device_mask = TESSEL_BIT(TESSEL_DEVICE_CPU);
  b->score = -1;
  b->plan = plan;
  b->destroy_plan = destroy_plan;
}

#ifdef CONTEXT_PLUGIN_V1

static tessel_status update_step(void* user_data, void* plan, const tessel_step_info* step, tessel_error* error) {
  (void)user_data;
  (void)step;
  (void)error;
  ((context_plan*)plan)->steps_seen += 1;
  return TESSEL_OK;
}

static tessel_status forward(void* user_data, void* plan, const tessel_tensor* q, const tessel_tensor* k,
                             const tessel_tensor* v, const tessel_tensor* out, const tessel_tensor* lse,
                             tessel_forward_stats* stats, tessel_error* error) {
  (void)user_data;
  tessel_status status = g_host->attention(q, k, v, out, lse, NULL, error);
  if (status == TESSEL_OK && stats != NULL) stats->density = (double)((const context_plan*)plan)->steps_seen;
  return status;
}

TESSEL_PLUGIN_EXPORT tessel_status tessel_plugin_init(const tessel_host_api* host, tessel_plugin_backend* backend,
                                                      tessel_error* error) {
  (void)error;
  g_host = host;
  backend->abi_version = 1u;
  backend->struct_size = (uint32_t)offsetof(tessel_plugin_backend, forward_with_context);
  fill_common(backend, "context_v1");
  backend->update_step = update_step;
  backend->forward = forward;
  return TESSEL_OK;
}

#else

static tessel_status forward_with_context(void* user_data, void* plan, const tessel_exec_context* ctx,
                                          const tessel_tensor* q, const tessel_tensor* k, const tessel_tensor* v,
                                          const tessel_tensor* out, const tessel_tensor* lse,
                                          tessel_forward_stats* stats, tessel_error* error) {
  (void)user_data;
  const context_plan* p = (const context_plan*)plan;
  if (ctx == NULL || ctx->struct_size < offsetof(tessel_exec_context, density) + sizeof ctx->density)
    return fail(error, "context_v2: no execution context");
  if ((unsigned long long)(size_t)ctx->stream != p->expect_stream)
    return fail(error, "context_v2: not the caller's stream");
  if ((unsigned long long)(size_t)ctx->workspace != p->expect_workspace)
    return fail(error, "context_v2: not the caller's workspace");
  tessel_status status = g_host->attention_with_context(ctx, q, k, v, out, lse, NULL, error);
  if (status == TESSEL_OK && stats != NULL) stats->density = isnan(ctx->density) ? 1.0 : ctx->density;
  return status;
}

TESSEL_PLUGIN_EXPORT tessel_status tessel_plugin_init(const tessel_host_api* host, tessel_plugin_backend* backend,
                                                      tessel_error* error) {
  if (host == NULL || host->abi_version < 2 || !TESSEL_HOST_HAS(host, attention_with_context))
    return fail(error, "context_v2: needs a tessel host with plugin ABI >= 2");
  g_host = host;
  backend->abi_version = TESSEL_PLUGIN_ABI_VERSION;
  backend->struct_size = (uint32_t)sizeof(tessel_plugin_backend);
  fill_common(backend, "context_v2");
  backend->forward_with_context = forward_with_context;
  return TESSEL_OK;
}

#endif
