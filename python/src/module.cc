// The extension module tessel._tessel. Every tessel::Error (and any other C++ exception) reaching
// Python becomes tessel.TesselError carrying the library's message; nothing is allowed to abort.
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"

namespace nb = nanobind;

NB_MODULE(_tessel, m) {
  m.doc() = "tessel: sparse attention kernels, block masks, planners, estimators and the Wan generator";
  static nb::exception<tessel::Error> error(m, "TesselError", PyExc_RuntimeError);
  m.def("cuda_compiled", &tessel::cuda_compiled, "True when this build carries CUDA kernels");
  m.def("cuda_available", &tessel::cuda_available, "True when CUDA kernels are built and a GPU is visible");
  tessel::python::bind_attention(m);
  tessel::python::bind_block_mask(m);
  tessel::python::bind_estimators(m);
  tessel::python::bind_pipeline(m);
  tessel::python::bind_planners(m);
  tessel::python::bind_sparse_module(m);
}
