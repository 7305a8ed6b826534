// SPDX-License-Identifier: Apache-2.0
// The checks around a device operation's work (ops.cpp's facade), and which device backend runs
// it: a fault of device work is reported by the operation whose work faulted, or as earlier
// work's by the next one that finds it, never as that next operation's own.
#pragma once

#include <cuda.h>

namespace vibespatial::raster::detail::ops {

/// How an operation's device work ends: queued (a raster result, valid in the stream's order), or
/// waited for (statistics and histograms, whose results reach the host).
enum class Work { queued, waited };

/// Whether device rasters go to the emulated device backend: the driver is the host emulator.
bool emulated_device();

/// Before operation @p op queues its device work on @p stream: throws CudaError ("device work
/// queued before it failed ...; <op> queued nothing", naming the last operation queued) when
/// earlier work failed. An operation that waits for its stream waits first (so that a fault its
/// own wait finds is its own); the others query the stream without waiting. Also rethrows what
/// the emulated backend's queued work raised.
void before_device_work(const char* op, CUstream stream, Work work);

/// After @p op queued its work (Work::queued): throws CudaError when a fault has surfaced since
/// before_device_work (its work's, or work queued just before it on another stream), and
/// remembers @p op (a string literal) as the last operation queued.
void after_device_work(const char* op, CUstream stream, Work work);

}  // namespace vibespatial::raster::detail::ops
