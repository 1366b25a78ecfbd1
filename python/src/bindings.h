// One function per group of bindings, each defined in its own file and called by module.cc.
#pragma once

#include <nanobind/nanobind.h>

namespace tessel::python {

void bind_attention(nanobind::module_& m);
void bind_block_mask(nanobind::module_& m);
void bind_estimators(nanobind::module_& m);
void bind_pipeline(nanobind::module_& m);  // tessel.WanPipeline
void bind_planners(nanobind::module_& m);
void bind_sparse_module(nanobind::module_& m);

}  // namespace tessel::python
