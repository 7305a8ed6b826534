// SPDX-License-Identifier: Apache-2.0
// The calling thread's op stream (dispatch.hpp: current_op_stream, OpStreamScope).
#include <vibespatial/raster/dispatch.hpp>

namespace vibespatial::raster {

namespace {
thread_local CUstream tl_op_stream = nullptr;
}  // namespace

CUstream current_op_stream() noexcept {
  return tl_op_stream;
}

OpStreamScope::OpStreamScope(CUstream stream) noexcept : previous_(tl_op_stream) {
  tl_op_stream = stream;
}

OpStreamScope::~OpStreamScope() {
  tl_op_stream = previous_;
}

}  // namespace vibespatial::raster
