// SPDX-License-Identifier: Apache-2.0
// io.hpp in a build without GDAL: the API links and every call says why it cannot work.
#include <vibespatial/raster/io.hpp>

#include <stdexcept>
#include <string>

namespace vibespatial::raster {

namespace {

[[noreturn]] void unavailable(const char* what) {
  throw std::runtime_error(std::string(what) +
                           ": vibespatial-raster was built without GDAL (install libgdal-dev "
                           "and reconfigure with -Dgdal=enabled)");
}

}  // namespace

bool io_available() noexcept {
  return false;
}

std::string output_driver_for(const std::string& /*path*/) {
  return "";
}

RasterFileInfo read_raster_info(const std::string& /*path*/, const OpenOptions& /*open*/) {
  unavailable("read_raster_info");
}

std::vector<std::string> default_input_drivers() {
  return {};
}

RasterMetadata read_raster_metadata(const std::string& /*path*/) {
  unavailable("read_raster_metadata");
}

RasterMetadata read_raster_metadata(const std::string& /*path*/, const OpenOptions& /*open*/) {
  unavailable("read_raster_metadata");
}

OwnedRasterArray read_raster(const std::string& /*path*/, std::optional<RasterWindow> /*window*/,
                             std::vector<int> /*bands*/) {
  unavailable("read_raster");
}

OwnedRasterArray read_raster(const std::string& /*path*/, std::optional<RasterWindow> /*window*/,
                             std::vector<int> /*bands*/, const OpenOptions& /*open*/) {
  unavailable("read_raster");
}

void write_raster(const std::string& /*path*/, const OwnedRasterArray& /*raster*/,
                  const WriteOptions& /*options*/) {
  unavailable("write_raster");
}

void check_write_options(const WriteOptions& /*options*/) {
  unavailable("check_write_options");
}

void check_output_file(const std::string& /*path*/, const WriteOptions& /*options*/,
                       DType /*dtype*/, int /*band_count*/,
                       const std::optional<NodataValue>& /*nodata*/, const std::string& /*crs*/) {
  unavailable("check_output_file");
}

void process_raster_streamed(const std::string& /*in*/, const std::string& /*out*/,
                             const BandOp& /*op*/, const RasterPlan& /*plan*/,
                             const WriteOptions& /*options*/,
                             std::function<void(std::int64_t, std::int64_t)> /*progress*/) {
  unavailable("process_raster_streamed");
}

std::uint64_t gdal_cache_for_plan(const std::string& /*in*/, const RasterPlan& /*plan*/,
                                  const StreamOptions& /*options*/) {
  unavailable("gdal_cache_for_plan");
}

void for_each_raster_tile(
    const std::string& /*in*/, const RasterPlan& /*plan*/,
    const std::function<void(const OwnedRasterArray&, const TileInfo&)>& /*visit*/,
    const StreamOptions& /*options*/) {
  unavailable("for_each_raster_tile");
}

void process_raster_file(const std::string& /*in*/, const std::string& /*out*/,
                         const BandOp& /*op*/, const RasterPlan& /*plan*/,
                         const StreamOptions& /*options*/) {
  unavailable("process_raster_file");
}

// The file ends cannot be made without GDAL: the constructors throw, so no other member runs.
struct RasterFileSource::State {};
struct RasterFileSink::State {};

RasterFileSource::RasterFileSource(const std::string& /*path*/, const OpenOptions& /*open*/,
                                   std::vector<int> /*bands*/) {
  unavailable("RasterFileSource");
}
RasterFileSource::~RasterFileSource() = default;
RasterMetadata RasterFileSource::metadata() const {
  unavailable("RasterFileSource");
}
std::vector<std::optional<NodataValue>> RasterFileSource::band_nodata() const {
  unavailable("RasterFileSource");
}
OwnedRasterArray RasterFileSource::read(const RasterWindow&, int, int) {
  unavailable("RasterFileSource");
}
const std::string& RasterFileSource::path() const {
  unavailable("RasterFileSource");
}
const std::vector<int>& RasterFileSource::bands() const {
  unavailable("RasterFileSource");
}
const std::vector<bool>& RasterFileSource::masked_bands() const {
  unavailable("RasterFileSource");
}
bool RasterFileSource::has_geotransform() const {
  unavailable("RasterFileSource");
}
const std::vector<bool>& RasterFileSource::nodata_marks_mask() const {
  unavailable("RasterFileSource");
}
std::uint64_t RasterFileSource::run_host_bytes(const RasterPlan&, bool, int,
                                               std::optional<std::uint64_t>) const {
  unavailable("RasterFileSource");
}
std::uint64_t RasterFileSource::gdal_cache_for(const RasterPlan&, bool) const {
  unavailable("RasterFileSource");
}
std::uint64_t RasterFileSource::block_bytes() const {
  unavailable("RasterFileSource");
}
void RasterFileSource::prepare(const RasterPlan&, const StreamOptions&, const std::string&) const {
  unavailable("RasterFileSource");
}
void RasterFileSource::close() noexcept {}

RasterFileSink::RasterFileSink(const std::string& /*path*/, const WriteOptions& /*options*/) {
  unavailable("RasterFileSink");
}
RasterFileSink::~RasterFileSink() = default;
void RasterFileSink::copy_from(const RasterFileSource&, MetadataCopy) {
  unavailable("RasterFileSink");
}
void RasterFileSink::before_commit(std::function<void()>) {
  unavailable("RasterFileSink");
}
void RasterFileSink::begin(const TileOutput&) {
  unavailable("RasterFileSink");
}
void RasterFileSink::begin_pass(int, int, const std::optional<NodataValue>&) {
  unavailable("RasterFileSink");
}
void RasterFileSink::write(const OwnedRasterArray&, const TileInfo&) {
  unavailable("RasterFileSink");
}
void RasterFileSink::finish() {
  unavailable("RasterFileSink");
}

}  // namespace vibespatial::raster
