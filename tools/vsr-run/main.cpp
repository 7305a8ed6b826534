// SPDX-License-Identifier: Apache-2.0
// vsr-run: applies a band operation (statistics, histogram, rescale, clip, nodata fill, 3x3 focal
// mean, normalized difference) to a raster file, or to a generated sample raster, within a VRAM
// budget, and prints a summary.
//
// Where it runs: the library's placement rule (placed, --device): on a real GPU (and a CUDA
// build) the ops run on the device, tiles moved there once through pinned staging (several
// bands of a per-band op by dispatch_per_band_gpu); with the host driver emulator or no driver
// at all the host ops run, labelled as such in the summary; on the emulator --device gpu runs
// them on its emulated device.
//
// The input (a file, or the sample) is one tile source and the output one tile sink (a file, a
// reduction, or nothing) of the library's tile executor: only the tiles in flight of the plan's
// bands and GDAL's block cache (capped from the plan) are in memory; statistics, histograms and
// rescale's range are streaming reductions. Only the sample is held whole.
//
// Files: steps.hpp (the step table: each step's name, options, halo, band rule and work, one
// step_*.cpp each), option_table.cpp and options.cpp (the command line, read against both
// tables), help.cpp (--help from them), job*.cpp (the run: job.cpp its flow and plan,
// job_input.cpp, job_write.cpp its one write path, job_reduce.cpp), report.cpp (what it prints).
//
// Output: written into a temporary directory beside --output and renamed into place only when
// complete and read back, so an error, a full disk or a signal (SIGINT, SIGTERM, ...) leaves the
// old file as it was (or no file) and no temporary file; --output may name the input itself (with
// --overwrite). The format is tried on a small file before any pixel is read.
//
// Exit status: 0 on success, 2 for bad arguments (message on stderr), 1 for any other error; a
// run ended by a signal dies of that signal. --memory-history FILE records the pool's memory
// history for the run and writes the snapshot (memory_history.hpp) when it ends; FILE is checked
// as an output before the run (never an input or the output).
#include "cli.hpp"
#include "job.hpp"
#include "options.hpp"

#include <vibespatial/raster/memory_history.hpp>

#include <cstdio>
#include <exception>
#include <string>

namespace vsr = vibespatial::raster;
using vsr_cli::printable;
using vsr_cli::UsageError;
using vsr_run::Arguments;

int main(int argc, char** argv) {
  Arguments args;
  try {
    args = argc > 1 && std::string(argv[1]) == "pipeline"
               ? vsr_run::parse_pipeline(argc - 1, argv + 1)
               : vsr_run::parse_arguments(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "vsr-run: %s\n", e.what());
    return 2;
  }
  if (args.help) {
    std::fputs(vsr_run::usage_text().c_str(), stdout);
    return 0;
  }
  const std::string& history = args.memory_history;
  if (!history.empty()) {
    // Refused before the run, not after it: the output's rules, and never a file of the run.
    try {
      vsr_run::check_target("--memory-history", history, args.overwrite,
                            vsr_run::files_of_the_run(args));
    } catch (const UsageError& e) {
      std::fprintf(stderr, "vsr-run: %s\n", e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "vsr-run: --memory-history: %s\n", printable(e.what()).c_str());
      return 1;
    }
    vsr::record_memory_history(true);
  }
  int status = 1;
  try {
    status = vsr_run::Job(args).run();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "vsr-run: %s\n", e.what());
    status = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vsr-run: error: %s\n", printable(e.what()).c_str());
    status = 1;
  }
  if (!history.empty()) {
    try {
      vsr::record_memory_history(false);
      vsr::dump_memory_snapshot(history, args.overwrite);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "vsr-run: --memory-history: %s\n", printable(e.what()).c_str());
      if (status == 0) status = 1;
    }
  }
  return status;
}
