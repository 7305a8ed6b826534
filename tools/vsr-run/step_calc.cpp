// SPDX-License-Identifier: Apache-2.0
// The calc step: band math over named inputs, one output band per --calc expression
// (docs/band-math.md). Its work is the library's vsr::calc over a tile of every input read
// (Job's calc path), or vsr::Pipeline::calc in a pipeline.
#include "steps.hpp"

namespace vsr_run {

const Step& calc_step() {
  static const Step s{
      .name = "calc",
      .summary =
          "band math over named inputs (-i NAME=FILE), one output band per --calc "
          "expression (docs/band-math.md); in a pipeline X is the previous step's output",
      .kind = StepKind::calc,
      .op = Op::calc,
      .options = {"--calc", "--compute", "--no-propagate-nodata", "--ot", "-a_nodata"},
      .per_band = false,
      .metadata = vsr::MetadataCopy::none,
      .default_dtype = [](vsr::DType) { return vsr::DType::float32; },
  };
  return s;
}

}  // namespace vsr_run
