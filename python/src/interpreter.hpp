// SPDX-License-Identifier: Apache-2.0
// How the extension gives up and takes back the GIL, and touches Python objects, from any thread
// and at any time, the interpreter's exit included.
//
// Why: before Python 3.14, a thread that asks for the GIL once the interpreter is finalizing is
// ended by pthread_exit(), which unwinds its stack by a forced unwind. A forced unwind that meets
// a noexcept frame (a destructor, nanobind's dispatcher, a noexcept library function) calls
// std::terminate: the process aborts at exit. So no thread here takes the GIL in a way that can
// end it under C++ frames:
// - GilRelease (nb::gil_scoped_release's replacement) parks the thread for good when taking the
//   GIL back is impossible (the interpreter is finalizing and this thread is not the one doing
//   it), which is what CPython 3.14 does itself; should the interpreter start finalizing while
//   the thread waits for the GIL, the forced unwind is caught in GilRelease and parks it there.
// - GilAcquire (for callbacks into Python from library code) refuses with InterpreterExiting
//   instead of taking the GIL then, and parks the thread if it is ended while taking it or while
//   Python code runs.
// - Python references owned by C++ (PyRef, PyException) never take the GIL to be dropped: without
//   it they are dropped later, by the next thread that takes the GIL through these guards.
// A parked thread holds no GIL; the guards park only where the library holds no lock of its own
// (at the binding's edge, or in a callback, which the library calls without its locks).
//
// A forced unwind can be caught only outside C++ exception handlers: caught while another
// exception is being handled, the C++ runtime terminates the process. So no Python code (which
// may give the GIL up at any bytecode) runs inside a catch block here: errors are translated
// without calling Python (errors.cpp, set_package_error), unraisable reports are made after the
// catch block, and the library's pool calls OOM handlers outside its own handlers. What remains
// out of reach is Python code that nanobind itself runs around a binding (a garbage collection
// triggered while converting arguments or results running a __del__ at the moment the
// interpreter starts finalizing).
#pragma once

#include <cxxabi.h>
#include <nanobind/nanobind.h>

#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace vsr_python {

/// Records the calling thread as the one finalizing the interpreter. Called by the module's
/// atexit hook (atexit functions run on that thread, before finalization starts).
void note_finalizing_thread() noexcept;

/// Records the interpreter's main thread (the finalizing thread unless the atexit hook ran
/// elsewhere). Called at module initialization, with the GIL.
void note_main_thread(unsigned long ident) noexcept;

/// Whether Python objects may be used: the interpreter is initialized and not finalizing.
bool python_alive() noexcept;

/// Whether the calling thread can take the GIL without being ended by CPython: the interpreter
/// is initialized, and it is not finalizing or this is the thread finalizing it.
bool can_take_gil() noexcept;

/// Whether the calling thread holds the GIL now.
bool thread_holds_gil() noexcept;

/// Blocks the calling thread forever (all signals blocked, so they go to the other threads).
[[noreturn]] void park_thread() noexcept;

/// Drops the Python references other threads released without the GIL. GIL held.
void release_deferred() noexcept;

/// Drops a strong reference from any thread: now when this thread holds the GIL, else by the
/// next thread that takes it through GilRelease / GilAcquire; leaked once Python is gone.
void release_reference(PyObject* obj) noexcept;

/// Thrown by GilAcquire where the calling thread cannot take the GIL (the interpreter exits).
class InterpreterExiting : public std::runtime_error {
 public:
  InterpreterExiting()
      : std::runtime_error("the Python interpreter is exiting: a Python callback cannot run") {}
};

/// Runs @p fn (which needs the GIL, and may run Python code); a forced unwind of the thread
/// (CPython ending it at exit) parks it instead of unwinding C++ frames.
template <class F>
decltype(auto) parking_at_exit(F&& fn) {
  try {
    return std::forward<F>(fn)();
  } catch (abi::__forced_unwind&) {
    park_thread();
  }
}

/// Gives up the GIL for the scope (nb::call_guard<GilRelease>() works too) and takes it back at
/// its end; where that is impossible because the interpreter is finalizing, the thread parks.
class GilRelease {
 public:
  GilRelease() noexcept : state_(PyEval_SaveThread()) {}
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;
  ~GilRelease();

 private:
  PyThreadState* state_;
};

/// Takes the GIL for the scope, on any thread (Python's or not), for a callback into Python.
/// @throws InterpreterExiting when the calling thread cannot take it.
class GilAcquire {
 public:
  GilAcquire();
  GilAcquire(const GilAcquire&) = delete;
  GilAcquire& operator=(const GilAcquire&) = delete;
  ~GilAcquire();

 private:
  PyGILState_STATE state_;
};

/// A strong reference to a Python object that C++ code may copy around (through shared_ptr) and
/// drop on any thread, even after the interpreter has gone (release_reference).
class PyRef {
 public:
  explicit PyRef(nanobind::object obj) noexcept : obj_(obj.release().ptr()) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() { release_reference(obj_); }
  /// The object, borrowed. GIL held to use it.
  nanobind::handle get() const noexcept { return obj_; }

 private:
  PyObject* obj_;
};

/// A Python exception carried through C++ frames (another thread's included) to the binding that
/// raises it again: unlike nb::python_error it never takes the GIL when dropped, so it may be
/// destroyed anywhere (a dispatcher discarding a second worker's error). Copies share it.
class PyException : public std::exception {
 public:
  /// Takes the exception out of @p e. GIL held.
  explicit PyException(nanobind::python_error& e);

  /// Makes the exception the pending Python error; a later call (on any copy) sets RuntimeError
  /// instead. GIL held.
  void restore() const noexcept;
  /// "Python exception <type name>".
  const char* what() const noexcept override { return what_->c_str(); }

 private:
  struct Slot;
  std::shared_ptr<Slot> slot_;
  std::shared_ptr<const std::string> what_;
};

/// Runs @p fn under the GIL (GilAcquire) for a callback from library code into Python: a Python
/// exception comes out as PyException, a forced unwind parks the thread. @p fn must leave no
/// Python object to be dropped after it returns (convert results to C++ inside it).
/// @throws InterpreterExiting when the calling thread cannot take the GIL.
template <class F>
decltype(auto) with_gil(F&& fn) {
  GilAcquire gil;
  return parking_at_exit([&]() -> decltype(auto) {
    try {
      return std::forward<F>(fn)();
    } catch (nanobind::python_error& e) {
      throw PyException(e);
    }
  });
}

}  // namespace vsr_python
