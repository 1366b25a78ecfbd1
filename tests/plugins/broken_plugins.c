/* Deliberately broken plugins for the loader tests (tests/sparse/plugin_loader_test.cc). Each is
 * compiled into its own library with one BROKEN_* macro defined:
 *   BROKEN_MISSING_SYMBOL  exports no tessel_plugin_init (only a misspelt entry point)
 *   BROKEN_WRONG_ABI       claims ABI version 999; also exports `zero_abi_init` (abi_version left 0)
 *                          and `incomplete_init` (no forward function)
 *   BROKEN_FAILING_INIT    init returns TESSEL_ERROR_UNSUPPORTED with a message
 *   BROKEN_BAD_TABLES      a valid tessel_plugin_init, and `path:symbol` targets that are no entry
 *                          point: oversized_table_init (struct_size past the host's room),
 *                          wild_pointer_init (forward points nowhere), odd_status_init (returns no
 *                          tessel_status), unterminated_message_init (fails without a NUL in the
 *                          message) and not_a_function (a data object)
 */
#include <stdio.h>

#include "tessel/plugin/tessel_plugin.h"

static tessel_status dummy_plan(void* u, const tessel_pattern_spec* s, const tessel_plan_request* r, void** p,
                                tessel_error* e) {
  (void)u; (void)s; (void)r; (void)e;
  *p = NULL;
  return TESSEL_OK;
}
static tessel_status dummy_forward(void* u, void* p, const tessel_tensor* q, const tessel_tensor* k,
                                   const tessel_tensor* v, const tessel_tensor* o, const tessel_tensor* l,
                                   tessel_forward_stats* st, tessel_error* e) {
  (void)u; (void)p; (void)q; (void)k; (void)v; (void)o; (void)l; (void)st; (void)e;
  return TESSEL_OK;
}
static void dummy_destroy(void* u, void* p) { (void)u; (void)p; }

static void fill_valid(tessel_plugin_backend* b, const char* name) {
  b->abi_version = TESSEL_PLUGIN_ABI_VERSION;
  b->struct_size = (uint32_t)sizeof(tessel_plugin_backend);
  b->name = name;
  b->pattern_mask = TESSEL_BIT(TESSEL_PATTERN_SLIDING_WINDOW);
  b->module_mask = TESSEL_BIT(TESSEL_MODULE_DIT_SELF);
  b->device_mask = TESSEL_BIT(TESSEL_DEVICE_CPU);
  b->plan = dummy_plan;
  b->forward = dummy_forward;
  b->destroy_plan = dummy_destroy;
}

#if defined(BROKEN_MISSING_SYMBOL)
TESSEL_PLUGIN_EXPORT tessel_status tessel_plugin_initialize(const tessel_host_api* h, tessel_plugin_backend* b,
                                                            tessel_error* e) {
  (void)h; (void)e;
  fill_valid(b, "broken_missing_symbol");
  return TESSEL_OK;
}
#elif defined(BROKEN_WRONG_ABI)
TESSEL_PLUGIN_EXPORT tessel_status tessel_plugin_init(const tessel_host_api* h, tessel_plugin_backend* b,
                                                      tessel_error* e) {
  (void)h; (void)e;
  fill_valid(b, "broken_wrong_abi");
  b->abi_version = 999u;
  return TESSEL_OK;
}
TESSEL_PLUGIN_EXPORT tessel_status zero_abi_init(const tessel_host_api* h, tessel_plugin_backend* b, tessel_error* e) {
  (void)h; (void)e;
  fill_valid(b, "broken_zero_abi");
  b->abi_version = 0u;
  return TESSEL_OK;
}
TESSEL_PLUGIN_EXPORT tessel_status incomplete_init(const tessel_host_api* h, tessel_plugin_backend* b, tessel_error* e) {
  (void)h; (void)e;
  fill_valid(b, "broken_incomplete");
  b->forward = NULL;
  return TESSEL_OK;
}
#elif defined(BROKEN_FAILING_INIT)
TESSEL_PLUGIN_EXPORT tessel_status tessel_plugin_init(const tessel_host_api* h, tessel_plugin_backend* b,
                                                      tessel_error* e) {
  (void)h; (void)b;
  snprintf(e->message, sizeof e->message, "no accelerator found for the broken plugin");
  return TESSEL_ERROR_UNSUPPORTED;
}
#elif defined(BROKEN_BAD_TABLES)
TESSEL_PLUGIN_EXPORT tessel_status tessel_plugin_init(const tessel_host_api* h, tessel_plugin_backend* b,
                                                      tessel_error* e) {
  (void)h; (void)e;
  fill_valid(b, "bad_tables_valid_entry");
  return TESSEL_OK;
}
TESSEL_PLUGIN_EXPORT tessel_status oversized_table_init(const tessel_host_api* h, tessel_plugin_backend* b,
                                                        tessel_error* e) {
  (void)h; (void)e;
  fill_valid(b, "bad_tables_oversized");
  b->struct_size = 1u << 20;
  return TESSEL_OK;
}
TESSEL_PLUGIN_EXPORT tessel_status wild_pointer_init(const tessel_host_api* h, tessel_plugin_backend* b,
                                                     tessel_error* e) {
  (void)h; (void)e;
  fill_valid(b, "bad_tables_wild");
  b->forward = (tessel_status(*)(void*, void*, const tessel_tensor*, const tessel_tensor*, const tessel_tensor*,
                                 const tessel_tensor*, const tessel_tensor*, tessel_forward_stats*, tessel_error*))(uintptr_t)0x10;
  return TESSEL_OK;
}
TESSEL_PLUGIN_EXPORT int odd_status_init(const tessel_host_api* h, tessel_plugin_backend* b, tessel_error* e) {
  (void)h; (void)b; (void)e;
  return 4242;
}
TESSEL_PLUGIN_EXPORT tessel_status unterminated_message_init(const tessel_host_api* h, tessel_plugin_backend* b,
                                                             tessel_error* e) {
  (void)h; (void)b;
  for (size_t i = 0; i < sizeof e->message; ++i) e->message[i] = 'x';
  return TESSEL_ERROR_INTERNAL;
}
TESSEL_PLUGIN_EXPORT int not_a_function = 7;
#else
#error "define one BROKEN_* macro"
#endif
