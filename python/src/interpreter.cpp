// SPDX-License-Identifier: Apache-2.0
// interpreter.hpp: the GIL guards that never let CPython end a thread under C++ frames, and
// Python references that may be dropped on any thread.
#include "interpreter.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace vsr_python {
namespace {

std::atomic<bool> g_finalizer_known{false};
pthread_t g_finalizer{};
std::atomic<unsigned long> g_main_thread{0};

bool interpreter_finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

bool this_thread_finalizes() noexcept {
  if (g_finalizer_known.load(std::memory_order_acquire)) {
    return pthread_equal(pthread_self(), g_finalizer) != 0;
  }
  return PyThread_get_thread_ident() == g_main_thread.load(std::memory_order_relaxed);
}

// References dropped by threads without the GIL, released by the next guard that takes it.
// Leaked on purpose: threads may drop references during static destruction.
struct Deferred {
  std::mutex mutex;
  std::vector<PyObject*> objects;
  std::atomic<bool> any{false};
};

Deferred& deferred() noexcept {
  static Deferred* d = new Deferred();
  return *d;
}

}  // namespace

void note_finalizing_thread() noexcept {
  g_finalizer = pthread_self();
  g_finalizer_known.store(true, std::memory_order_release);
}

void note_main_thread(unsigned long ident) noexcept {
  g_main_thread.store(ident, std::memory_order_relaxed);
}

bool python_alive() noexcept {
  return Py_IsInitialized() != 0 && !interpreter_finalizing();
}

bool can_take_gil() noexcept {
  // Finalization clears Py_IsInitialized() as it starts, while its thread still runs Python.
  if (interpreter_finalizing()) return this_thread_finalizes();
  return Py_IsInitialized() != 0;
}

bool thread_holds_gil() noexcept {
  if (Py_IsInitialized() == 0 && !interpreter_finalizing()) return false;
#if PY_VERSION_HEX >= 0x030D0000
  PyThreadState* t = PyThreadState_GetUnchecked();
#else
  PyThreadState* t = _PyThreadState_UncheckedGet();
#endif
  // Up to 3.11 the current thread state is the GIL holder's, whichever thread that is.
  return t != nullptr && t->thread_id == PyThread_get_thread_ident();
}

void park_thread() noexcept {
  // What the parked thread holds (its call's arguments, a raster being built) is never released:
  // nanobind would report those objects as leaks at exit, as if the bindings had a bug.
  nanobind::set_leak_warnings(false);
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  for (;;) pause();
}

void release_deferred() noexcept {
  Deferred& d = deferred();
  if (!d.any.load(std::memory_order_acquire)) return;
  std::vector<PyObject*> objects;
  {
    std::lock_guard lock(d.mutex);
    objects.swap(d.objects);
    d.any.store(false, std::memory_order_release);
  }
  // Dropping an object can run Python code (__del__), which may end this thread at exit.
  parking_at_exit([&] {
    for (PyObject* o : objects) Py_DECREF(o);
  });
}

void release_reference(PyObject* obj) noexcept {
  if (obj == nullptr) return;
  if (thread_holds_gil()) {
    parking_at_exit([&] { Py_DECREF(obj); });
    return;
  }
  if (!python_alive()) return;  // the interpreter is going: leaked
  Deferred& d = deferred();
  try {
    std::lock_guard lock(d.mutex);
    d.objects.push_back(obj);
    d.any.store(true, std::memory_order_release);
  } catch (...) {
    // No memory for the list: leaked.
  }
}

GilRelease::~GilRelease() {
  if (!can_take_gil()) park_thread();
  try {
    PyEval_RestoreThread(state_);
  } catch (...) {  // a C function: only the forced unwind of pthread_exit() comes out
    // The interpreter started finalizing while this thread waited for the GIL.
    park_thread();
  }
  release_deferred();
}

GilAcquire::GilAcquire() {
  if (!can_take_gil()) throw InterpreterExiting();
  try {
    state_ = PyGILState_Ensure();
  } catch (...) {  // as in ~GilRelease
    park_thread();
  }
  release_deferred();
}

GilAcquire::~GilAcquire() {
  // Releasing a thread state made for a foreign thread clears it, which can run Python code.
  try {
    PyGILState_Release(state_);
  } catch (...) {  // as in ~GilRelease
    park_thread();
  }
}

struct PyException::Slot {
  std::atomic<PyObject*> value;
  explicit Slot(PyObject* v) noexcept : value(v) {}
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  ~Slot() { release_reference(value.exchange(nullptr)); }
};

PyException::PyException(nanobind::python_error& e) {
  PyObject* value = e.value().ptr();
  Py_XINCREF(value);
  e.restore();  // the error indicator now holds e's reference: clear it
  PyErr_Clear();
  slot_ = std::make_shared<Slot>(value);
  what_ = std::make_shared<const std::string>(std::string("Python exception ") +
                                              (value != nullptr ? Py_TYPE(value)->tp_name : "?"));
}

void PyException::restore() const noexcept {
  PyObject* value = slot_->value.exchange(nullptr);
  if (value == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "a Python exception was raised twice from C++");
    return;
  }
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(value);
#else
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(value));
  Py_INCREF(type);
  PyErr_Restore(type, value, PyException_GetTraceback(value));
#endif
}

}  // namespace vsr_python
