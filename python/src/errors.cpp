// SPDX-License-Identifier: Apache-2.0
// How the library's exceptions reach Python: the exception translator of the module and the
// check of C ABI statuses (bindings.hpp).
#include "bindings.hpp"

#include <vibespatial/raster/errors.hpp>

#include <cctype>
#include <cstddef>
#include <exception>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace vsr_python {

namespace {

/// Raises vibespatial_raster._errors.<name>(message) with the attributes @p attrs as the pending
/// Python error. The instance is made as the class's __init__ makes it, but without running
/// Python code: this runs inside nanobind's exception handler, where a thread that CPython ends
/// at exit (it would be, at any bytecode) aborts the process.
void set_package_error(const char* name, const std::string& message,
                       std::initializer_list<std::pair<const char*, nb::object>> attrs) {
  try {
    nb::object cls = nb::module_::import_("vibespatial_raster._errors").attr(name);
    auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
    nb::tuple args = nb::make_tuple(message);
    nb::object instance = nb::steal(type->tp_new(type, args.ptr(), nullptr));
    if (!instance.is_valid()) throw nb::python_error();
    for (const auto& [attr, value] : attrs) {
      if (PyObject_GenericSetAttr(instance.ptr(), nb::str(attr).ptr(), value.ptr()) != 0) {
        throw nb::python_error();
      }
    }
    PyErr_SetObject(cls.ptr(), instance.ptr());
  } catch (nb::python_error& e) {
    e.restore();
  }
}

/// The CUresult enumerator name in a C ABI error message ("CUDA_ERROR_..."), or "".
std::string cuda_error_name(const std::string& message) {
  const std::size_t at = message.find("CUDA_ERROR_");
  if (at == std::string::npos) return {};
  std::size_t end = at;
  while (end < message.size() &&
         (std::isupper(static_cast<unsigned char>(message[end])) != 0 ||
          std::isdigit(static_cast<unsigned char>(message[end])) != 0 || message[end] == '_')) {
    ++end;
  }
  return message.substr(at, end - at);
}

}  // namespace

void translate_exception(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const vsr_python::PyException& e) {
    e.restore();  // a callback's exception (a band op's, an OOM handler's), as it was raised
  } catch (const vsr::DriverUnavailableError& e) {
    set_package_error("DriverUnavailableError", e.what(),
                      {{"code", nb::int_(e.code())}, {"name", nb::str(e.name().c_str())}});
  } catch (const vsr::CudaError& e) {
    set_package_error("CudaError", e.what(),
                      {{"code", nb::int_(e.code())}, {"name", nb::str(e.name().c_str())}});
  } catch (const vsr::OutOfMemoryError& e) {
    set_package_error("OutOfMemoryError", e.what(),
                      {{"requested_bytes", nb::int_(e.requested_bytes())}});
  } catch (const std::system_error& e) {
    // An errno (a missing file): OSError(errno, message) is the errno's subclass, e.g.
    // FileNotFoundError. Other categories fall through to nanobind's RuntimeError.
    if (e.code().category() != std::generic_category() &&
        e.code().category() != std::system_category()) {
      throw;
    }
    try {
      nb::object error = nb::handle(PyExc_OSError)(e.code().value(), e.what());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    } catch (nb::python_error& pe) {
      pe.restore();
    }
  }
}

void check(vsr_status status) {
  if (status == VSR_OK) return;
  const std::string message = vsr_last_error_message();
  const int code = vsr_last_cuda_error();
  switch (status) {
    case VSR_ERROR_INVALID_ARGUMENT:
      throw std::invalid_argument(message);
    case VSR_ERROR_OUT_OF_MEMORY:
      throw vsr::OutOfMemoryError(0, message);
    case VSR_ERROR_CUDA:
      throw vsr::CudaError(code, cuda_error_name(message), message);
    case VSR_ERROR_NO_DRIVER:
      throw vsr::DriverUnavailableError(code, cuda_error_name(message), message);
    case VSR_ERROR_OVERFLOW:
      throw std::overflow_error(message);
    case VSR_ERROR_OUT_OF_RANGE:
      throw std::out_of_range(message);
    default:
      throw std::runtime_error(message);
  }
}

}  // namespace vsr_python
