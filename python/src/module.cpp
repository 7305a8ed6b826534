// SPDX-License-Identifier: Apache-2.0
// vibespatial_raster._core: the nanobind bindings of the C++ library, used by the package's
// Python modules (memory, dispatch, buffers, ops, io, allocators). Private: names and
// signatures here may change with the Python modules; users import those. This file is the
// module's init; the bindings are in bind_memory.cpp, bind_rasters.cpp, bind_ops.cpp,
// bind_io.cpp and bind_zonal.cpp, their conventions in bindings.hpp.
#include "bindings.hpp"

#include <atomic>

// nanobind's module init is renamed (it is not exported: exports.map) so that PyInit__core below
// can refuse a subinterpreter before it runs.
#define PyInit__core nanobind_generated_init__core

namespace {
/// Set once the module has been initialized (in the main interpreter, once per process).
std::atomic<bool> g_module_initialized{false};
}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "Bindings of the vibespatial-raster C++ library (private: use the package's modules).";
  nb::register_exception_translator(vsr_python::translate_exception, nullptr);

  // Which thread may still take the GIL while the interpreter finalizes: the one running the
  // atexit functions (our hook says which), else the main thread.
  vsr_python::note_main_thread(nb::cast<unsigned long>(
      nb::module_::import_("threading").attr("main_thread")().attr("ident")));
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    vsr_python::note_finalizing_thread();
    vsr_python::release_deferred();
  }));

  m.attr("__version__") = vsr_version();

  vsr_python::bind_memory(m);
  vsr_python::bind_rasters(m);
  vsr_python::bind_ops(m);
  vsr_python::bind_io(m);
  vsr_python::bind_zonal(m);

  g_module_initialized.store(true);
}

#undef PyInit__core

/// The module's init: refuses every interpreter but the main one, and a second initialization
/// in it, before anything is touched. The extension's state (nanobind's per-extension internals,
/// its registered types, the pool's Python handlers) is one per process: initialized again in a
/// subinterpreter it would be overwritten and the main interpreter broken (objects refused by
/// their own methods, crashes); initialized again in the main interpreter (the module dropped
/// from sys.modules and imported anew) the new module would lack its types.
extern "C" NB_EXPORT PyObject* PyInit__core(void) {
  if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
    PyErr_SetString(PyExc_ImportError,
                    "vibespatial_raster cannot be imported in a subinterpreter: its native state "
                    "is one per process (import it in the main interpreter only)");
    return nullptr;
  }
  if (g_module_initialized.load()) {
    PyErr_SetString(PyExc_ImportError,
                    "vibespatial_raster._core is already initialized in this process and cannot "
                    "be initialized again (keep the module object first imported; do not remove "
                    "it from sys.modules)");
    return nullptr;
  }
  return nanobind_generated_init__core();
}
