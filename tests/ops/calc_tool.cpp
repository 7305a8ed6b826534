// SPDX-License-Identifier: Apache-2.0
// vsr-test-calc: band math on raster files through the library, for the judge that compares it
// with gdal_calc.py (calc_judge.py). Reads each input with read_raster, runs calc, writes the
// result with write_raster.
//
//   vsr-test-calc OUT.tif -i NAME=PATH [-i NAME=PATH ...] -e EXPR [-e EXPR ...]
//                 [--ot TYPE] [--nodata V] [--no-propagate] [--compute-float32]
//
// TYPE is a numpy name (default float32); V a decimal or "nan". Exit status 0 on success, 1 with
// the error on stderr otherwise, 2 for a bad command line.
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/ops.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace vsr = vibespatial::raster;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: vsr-test-calc OUT -i NAME=PATH -e EXPR [options]\n");
    return 2;
  }
  const std::string out = argv[1];
  std::vector<std::string> expressions;
  std::vector<std::pair<std::string, std::string>> files;
  vsr::CalcOptions options;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "vsr-test-calc: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-i") {
      const std::string v = value();
      const std::size_t eq = v.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "vsr-test-calc: -i takes NAME=PATH\n");
        return 2;
      }
      files.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (a == "-e") {
      expressions.push_back(value());
    } else if (a == "--ot") {
      const auto t = vsr::dtype_from_string(value());
      if (!t) {
        std::fprintf(stderr, "vsr-test-calc: unknown type\n");
        return 2;
      }
      options.output = *t;
    } else if (a == "--nodata") {
      options.output_nodata = vsr::NodataValue(std::strtod(value().c_str(), nullptr));
    } else if (a == "--no-propagate") {
      options.propagate_nodata = false;
    } else if (a == "--compute-float32") {
      options.compute_float32 = true;
    } else {
      std::fprintf(stderr, "vsr-test-calc: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    std::vector<vsr::CalcInput> inputs;
    for (const auto& [name, path] : files) {
      inputs.push_back(vsr::CalcInput{name, vsr::read_raster(path)});
    }
    vsr::WriteOptions write;
    write.compress = "NONE";
    vsr::write_raster(out, vsr::calc(expressions, inputs, options), write);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
