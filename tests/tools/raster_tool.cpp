// SPDX-License-Identifier: Apache-2.0
// vsr-test-raster: makes, inspects and damages raster files with GDAL's C API, for the tests that
// run the command-line tools (tests/tools/cli_tests.py). It never goes through vibespatial-raster,
// so what it writes and reads is independent of the code under test.
//
//   make PATH [options]       writes a raster whose pixels follow value() below
//     --width W --height H --bands B --dtype NAME (numpy names) --driver NAME (default GTiff)
//     --block N (tiled, N x N) | --strip (striped, the default) --compress NAME
//     --interleave band|pixel --nodata V (decimal; exact for 64-bit integers) [--band-nodata B V]
//     --sparse (no pixel written: SPARSE_OK, reads as nodata or 0) --no-geotransform
//     --co KEY=VALUE (more creation options) --nodata-every N (every Nth pixel is nodata)
//     --value FORMULA: ramp (default), const:V, list:V1,V2,... (cycled)
//     --metadata (scale/offset, units, descriptions, colour interpretation, AREA_OR_POINT)
//     --mask internal|external|alpha --mask-every N: a GDAL mask, 0 (invalid) at every Nth
//       pixel: a per-dataset mask inside the GeoTIFF or in a .msk beside it, or the last band
//       as alpha (GTiff ALPHA=YES; 0 or 255)
//   dump PATH                 prints the raster as JSON (metadata and every pixel; Python reads
//                             NaN/Infinity tokens); 64-bit integers and nodata are exact
//   header PATH               dump without the pixels
//   corrupt PATH --from-block K
//                             overwrites the compressed bytes of band 1's blocks K, K+1, ...
//                             (row-major block order) with 0xFF, so reading them fails
//   block-offset PATH K       prints the file offset of band 1's block K
//   drivers [--createcopy]    prints this GDAL's raster drivers that have Create (with
//                             --createcopy: CreateCopy and no Create) as JSON
//                             ([{"name": ..., "extension": first of DMD_EXTENSIONS or ""}])
//
// Exit status 0 on success, 1 on any failure (message on stderr).
#include <cpl_conv.h>
#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>

#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

struct Fail : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The GDAL types a raster of this tool may have, with their numpy names.
struct TypeName {
  GDALDataType type;
  const char* name;
};
constexpr TypeName kTypeNames[] = {
    {GDT_Byte, "uint8"},    {GDT_UInt16, "uint16"},   {GDT_Int16, "int16"},
    {GDT_UInt32, "uint32"}, {GDT_Int32, "int32"},     {GDT_UInt64, "uint64"},
    {GDT_Int64, "int64"},   {GDT_Float32, "float32"}, {GDT_Float64, "float64"}};

GDALDataType type_of(const std::string& name) {
  for (const TypeName& t : kTypeNames) {
    if (name == t.name) return t.type;
  }
  throw Fail("unknown dtype " + name);
}

const char* name_of(GDALDataType type) {
  for (const TypeName& t : kTypeNames) {
    if (type == t.type) return t.name;
  }
  return "other";
}

/// Calls @p f with a value of the C++ type of GDAL @p type; false (f not called) for a type not
/// in kTypeNames.
template <class F>
bool with_type(GDALDataType type, F&& f) {
  switch (type) {
    case GDT_Byte:
      f(std::uint8_t{});
      return true;
    case GDT_UInt16:
      f(std::uint16_t{});
      return true;
    case GDT_Int16:
      f(std::int16_t{});
      return true;
    case GDT_UInt32:
      f(std::uint32_t{});
      return true;
    case GDT_Int32:
      f(std::int32_t{});
      return true;
    case GDT_UInt64:
      f(std::uint64_t{});
      return true;
    case GDT_Int64:
      f(std::int64_t{});
      return true;
    case GDT_Float32:
      f(float{});
      return true;
    case GDT_Float64:
      f(double{});
      return true;
    default:
      return false;
  }
}

bool is_float(GDALDataType t) {
  return t == GDT_Float32 || t == GDT_Float64;
}

/// The value pattern of `make`.
struct Pattern {
  std::string kind = "ramp";
  std::vector<std::string> list;  // decimal texts, exact for 64-bit integers
  long nodata_every = 0;
};

/// The text of the pixel (b, y, x) of a raster of `type` (a decimal the type holds exactly).
std::string value_text(const Pattern& p, GDALDataType type, int b, long y, long x, long width,
                       const std::string& nodata) {
  const long i = (static_cast<long>(b) * 1000003L + y * width + x);
  if (p.nodata_every > 0 && !nodata.empty() && i % p.nodata_every == 0) return nodata;
  if (p.kind == "list") return p.list[static_cast<std::size_t>(i) % p.list.size()];
  if (p.kind == "const") return p.list.at(0);
  const long v = (b * 7919L + y * 131L + x * 17L) % 1000L;
  if (is_float(type)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(v) * 0.25 - 40.0);
    return buf;
  }
  if (type == GDT_Byte) return std::to_string(v % 251);
  if (type == GDT_Int16 || type == GDT_Int32 || type == GDT_Int64) return std::to_string(v - 300);
  return std::to_string(v);
}

/// Stores decimal @p text as one element of @p type at @p dst.
void store(GDALDataType type, const std::string& text, void* dst) {
  const bool known = with_type(type, [&](auto zero) {
    using T = decltype(zero);
    T v;
    if constexpr (std::is_floating_point_v<T>) {
      v = static_cast<T>(std::strtod(text.c_str(), nullptr));
    } else if constexpr (std::is_signed_v<T>) {
      v = static_cast<T>(std::strtoll(text.c_str(), nullptr, 10));
    } else {
      v = static_cast<T>(std::strtoull(text.c_str(), nullptr, 10));
    }
    std::memcpy(dst, &v, sizeof v);
  });
  if (!known) throw Fail("bad type");
}

void set_nodata(GDALRasterBandH band, GDALDataType type, const std::string& text) {
  CPLErr err = CE_None;
  if (type == GDT_Int64) {
    err = GDALSetRasterNoDataValueAsInt64(band, std::strtoll(text.c_str(), nullptr, 10));
  } else if (type == GDT_UInt64) {
    err = GDALSetRasterNoDataValueAsUInt64(band, std::strtoull(text.c_str(), nullptr, 10));
  } else {
    err = GDALSetRasterNoDataValue(band, std::strtod(text.c_str(), nullptr));
  }
  if (err != CE_None) throw Fail("cannot set nodata " + text);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p - start));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return out;
}

int make(int argc, char** argv) {
  const std::string path = argv[2];
  int width = 64, height = 48, bands = 1, block = 0;
  std::string dtype = "float32", driver = "GTiff", compress, interleave, nodata;
  std::vector<std::pair<int, std::string>> band_nodata;
  std::vector<std::string> extra;
  bool sparse = false, no_gt = false, metadata = false;
  std::string mask;
  long mask_every = 0;
  Pattern pattern;
  for (int i = 3; i < argc; ++i) {
    const std::string o = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Fail(o + " needs a value");
      return argv[++i];
    };
    if (o == "--width") {
      width = std::atoi(value().c_str());
    } else if (o == "--height") {
      height = std::atoi(value().c_str());
    } else if (o == "--bands") {
      bands = std::atoi(value().c_str());
    } else if (o == "--dtype") {
      dtype = value();
    } else if (o == "--driver") {
      driver = value();
    } else if (o == "--block") {
      block = std::atoi(value().c_str());
    } else if (o == "--strip") {
      block = 0;
    } else if (o == "--compress") {
      compress = value();
    } else if (o == "--interleave") {
      interleave = value();
    } else if (o == "--nodata") {
      nodata = value();
    } else if (o == "--band-nodata") {
      const int b = std::atoi(value().c_str());
      band_nodata.emplace_back(b, value());
    } else if (o == "--sparse") {
      sparse = true;
    } else if (o == "--no-geotransform") {
      no_gt = true;
    } else if (o == "--metadata") {
      metadata = true;
    } else if (o == "--mask") {
      mask = value();
    } else if (o == "--mask-every") {
      mask_every = std::atol(value().c_str());
    } else if (o == "--co") {
      extra.push_back(value());
    } else if (o == "--nodata-every") {
      pattern.nodata_every = std::atol(value().c_str());
    } else if (o == "--value") {
      const std::string v = value();
      if (v == "ramp") {
        pattern.kind = "ramp";
      } else if (v.rfind("const:", 0) == 0) {
        pattern.kind = "const";
        pattern.list = {v.substr(6)};
      } else if (v.rfind("list:", 0) == 0) {
        pattern.kind = "list";
        pattern.list = split(v.substr(5), ',');
      } else {
        throw Fail("bad --value " + v);
      }
    } else {
      throw Fail("unknown make option " + o);
    }
  }
  const GDALDataType type = type_of(dtype);
  GDALAllRegister();
  GDALDriverH drv = GDALGetDriverByName(driver.c_str());
  if (drv == nullptr) throw Fail("no driver " + driver);
  CPLStringList co;
  if (driver == "GTiff") {
    if (block > 0) {
      co.SetNameValue("TILED", "YES");
      co.SetNameValue("BLOCKXSIZE", std::to_string(block).c_str());
      co.SetNameValue("BLOCKYSIZE", std::to_string(block).c_str());
    }
    if (!compress.empty()) co.SetNameValue("COMPRESS", compress.c_str());
    if (!interleave.empty()) co.SetNameValue("INTERLEAVE", interleave.c_str());
    if (sparse) co.SetNameValue("SPARSE_OK", "TRUE");
    if (mask == "alpha") co.SetNameValue("ALPHA", "YES");
    co.SetNameValue("BIGTIFF", "IF_SAFER");
  }
  for (const std::string& kv : extra) co.AddString(kv.c_str());
  GDALDatasetH ds = GDALCreate(drv, path.c_str(), width, height, bands, type, co.List());
  if (ds == nullptr) throw Fail(std::string("create failed: ") + CPLGetLastErrorMsg());
  if (!no_gt) {
    double gt[6] = {500000, 10, 0, 5000000, 0, -10};
    GDALSetGeoTransform(ds, gt);
    GDALSetProjection(
        ds,
        "PROJCS[\"WGS 84 / UTM zone 33N\",GEOGCS[\"WGS 84\",DATUM[\"WGS_1984\",SPHEROID[\"WGS "
        "84\",6378137,298.257223563]],PRIMEM[\"Greenwich\",0],UNIT[\"degree\",0.0174532925199433]],"
        "PROJECTION[\"Transverse_Mercator\"],PARAMETER[\"latitude_of_origin\",0],PARAMETER["
        "\"central_meridian\",15],PARAMETER[\"scale_factor\",0.9996],PARAMETER[\"false_easting\","
        "500000],PARAMETER[\"false_northing\",0],UNIT[\"metre\",1],AUTHORITY[\"EPSG\",\"32633\"]]");
  }
  if (metadata) GDALSetMetadataItem(ds, "AREA_OR_POINT", "Point", nullptr);
  for (int b = 1; b <= bands; ++b) {
    GDALRasterBandH band = GDALGetRasterBand(ds, b);
    if (!nodata.empty()) set_nodata(band, type, nodata);
    if (metadata) {
      GDALSetRasterScale(band, 0.5 * b);
      GDALSetRasterOffset(band, 10.0 * b);
      GDALSetRasterUnitType(band, "metre");
      GDALSetDescription(band, ("band number " + std::to_string(b)).c_str());
      GDALSetRasterColorInterpretation(band, b == 1 ? GCI_RedBand : GCI_Undefined);
    }
  }
  for (const auto& [b, v] : band_nodata) set_nodata(GDALGetRasterBand(ds, b), type, v);
  if (!sparse) {
    const int item = GDALGetDataTypeSizeBytes(type);
    std::vector<unsigned char> row(static_cast<std::size_t>(width) *
                                   static_cast<std::size_t>(item));
    for (int b = 0; b < bands; ++b) {
      GDALRasterBandH band = GDALGetRasterBand(ds, b + 1);
      for (long y = 0; y < height; ++y) {
        for (long x = 0; x < width; ++x) {
          store(type, value_text(pattern, type, b, y, x, width, nodata),
                row.data() + static_cast<std::size_t>(x) * static_cast<std::size_t>(item));
        }
        if (GDALRasterIO(band, GF_Write, 0, static_cast<int>(y), width, 1, row.data(), width, 1,
                         type, 0, 0) != CE_None) {
          throw Fail(std::string("write failed: ") + CPLGetLastErrorMsg());
        }
      }
    }
  }
  if (!mask.empty() && mask_every > 0) {
    // 0 (invalid) at every mask_every-th pixel, 255 elsewhere.
    std::vector<unsigned char> row(static_cast<std::size_t>(width));
    GDALRasterBandH target = nullptr;
    if (mask == "alpha") {
      target = GDALGetRasterBand(ds, bands);
      GDALSetRasterColorInterpretation(target, GCI_AlphaBand);
    } else if (mask == "internal" || mask == "external") {
      CPLSetConfigOption("GDAL_TIFF_INTERNAL_MASK", mask == "internal" ? "YES" : "NO");
      if (GDALCreateDatasetMaskBand(ds, GMF_PER_DATASET) != CE_None) {
        throw Fail(std::string("cannot create the mask: ") + CPLGetLastErrorMsg());
      }
      CPLSetConfigOption("GDAL_TIFF_INTERNAL_MASK", nullptr);
      target = GDALGetMaskBand(GDALGetRasterBand(ds, 1));
    } else {
      throw Fail("bad --mask " + mask);
    }
    for (long y = 0; y < height; ++y) {
      for (long x = 0; x < width; ++x) {
        row[static_cast<std::size_t>(x)] = (y * width + x) % mask_every == 0 ? 0 : 255;
      }
      if (GDALRasterIO(target, GF_Write, 0, static_cast<int>(y), width, 1, row.data(), width, 1,
                       GDT_Byte, 0, 0) != CE_None) {
        throw Fail(std::string("mask write failed: ") + CPLGetLastErrorMsg());
      }
    }
  }
  GDALClose(ds);
  return 0;
}

std::string number(GDALDataType type, const unsigned char* p) {
  std::string text = "null";
  with_type(type, [&](auto zero) {
    using T = decltype(zero);
    T v;
    std::memcpy(&v, p, sizeof v);
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(v)) {
        text = "NaN";
      } else if (std::isinf(v)) {
        text = v > 0 ? "Infinity" : "-Infinity";
      } else {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", static_cast<double>(v));
        text = buf;
      }
    } else {
      text = std::to_string(v);
    }
  });
  return text;
}

std::string json_text(const char* s) {
  std::string out = "\"";
  for (const char* c = s; *c != '\0'; ++c) {
    const auto u = static_cast<unsigned char>(*c);
    if (*c == '"' || *c == '\\') {
      out += '\\';
      out += *c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += *c;
    }
  }
  return out + "\"";
}

int dump(const std::string& path, bool pixels = true) {
  GDALAllRegister();
  GDALDatasetH ds =
      GDALOpenEx(path.c_str(), GDAL_OF_RASTER | GDAL_OF_READONLY, nullptr, nullptr, nullptr);
  if (ds == nullptr) throw Fail(std::string("cannot open: ") + CPLGetLastErrorMsg());
  const int w = GDALGetRasterXSize(ds), h = GDALGetRasterYSize(ds), n = GDALGetRasterCount(ds);
  double gt[6];
  const bool has_gt = GDALGetGeoTransform(ds, gt) == CE_None;
  std::printf("{\"driver\": %s, \"width\": %d, \"height\": %d, \"bands\": %d, ",
              json_text(GDALGetDriverShortName(GDALGetDatasetDriver(ds))).c_str(), w, h, n);
  if (has_gt) {
    std::printf("\"geotransform\": [%.17g, %.17g, %.17g, %.17g, %.17g, %.17g], ", gt[0], gt[1],
                gt[2], gt[3], gt[4], gt[5]);
  } else {
    std::printf("\"geotransform\": null, ");
  }
  std::printf("\"crs\": %s, ", json_text(GDALGetProjectionRef(ds)).c_str());
  const char* aop = GDALGetMetadataItem(ds, "AREA_OR_POINT", nullptr);
  std::printf("\"area_or_point\": %s, ", aop != nullptr ? json_text(aop).c_str() : "null");
  const char* comp = GDALGetMetadataItem(ds, "COMPRESSION", "IMAGE_STRUCTURE");
  std::printf("\"compression\": %s, ", comp != nullptr ? json_text(comp).c_str() : "null");
  const char* layout = GDALGetMetadataItem(ds, "LAYOUT", "IMAGE_STRUCTURE");
  std::printf("\"layout\": %s, ", layout != nullptr ? json_text(layout).c_str() : "null");
  std::printf("\"overviews\": [");
  if (n > 0) {
    GDALRasterBandH first = GDALGetRasterBand(ds, 1);
    for (int o = 0; o < GDALGetOverviewCount(first); ++o) {
      GDALRasterBandH ov = GDALGetOverview(first, o);
      std::printf("%s[%d, %d]", o ? ", " : "", GDALGetRasterBandXSize(ov),
                  GDALGetRasterBandYSize(ov));
    }
  }
  std::printf("], ");
  std::printf("\"band_info\": [");
  for (int b = 1; b <= n; ++b) {
    GDALRasterBandH band = GDALGetRasterBand(ds, b);
    const GDALDataType t = GDALGetRasterDataType(band);
    int has = 0;
    std::string nd = "null";
    if (t == GDT_Int64) {
      const std::int64_t v = GDALGetRasterNoDataValueAsInt64(band, &has);
      if (has) nd = std::to_string(v);
    } else if (t == GDT_UInt64) {
      const std::uint64_t v = GDALGetRasterNoDataValueAsUInt64(band, &has);
      if (has) nd = std::to_string(v);
    } else {
      const double v = GDALGetRasterNoDataValue(band, &has);
      if (has) {
        const auto bytes = reinterpret_cast<const unsigned char*>(&v);
        nd = number(GDT_Float64, bytes);
      }
    }
    int bx = 0, by = 0;
    GDALGetBlockSize(band, &bx, &by);
    int has_scale = 0, has_offset = 0;
    const double scale = GDALGetRasterScale(band, &has_scale);
    const double offset = GDALGetRasterOffset(band, &has_offset);
    std::printf(
        "%s{\"dtype\": \"%s\", \"nodata\": %s, \"block\": [%d, %d], \"scale\": %.17g, "
        "\"offset\": %.17g, \"unit\": %s, \"description\": %s, \"color\": %s}",
        b > 1 ? ", " : "", name_of(t), nd.c_str(), bx, by, has_scale ? scale : 1.0,
        has_offset ? offset : 0.0, json_text(GDALGetRasterUnitType(band)).c_str(),
        json_text(GDALGetDescription(band)).c_str(),
        json_text(GDALGetColorInterpretationName(GDALGetRasterColorInterpretation(band))).c_str());
  }
  std::printf("], \"pixels\": [");
  for (int b = 1; pixels && b <= n; ++b) {
    GDALRasterBandH band = GDALGetRasterBand(ds, b);
    const GDALDataType t = GDALGetRasterDataType(band);
    const int item = GDALGetDataTypeSizeBytes(t);
    std::vector<unsigned char> buf(static_cast<std::size_t>(w) * static_cast<std::size_t>(h) *
                                   static_cast<std::size_t>(item));
    if (GDALRasterIO(band, GF_Read, 0, 0, w, h, buf.data(), w, h, t, 0, 0) != CE_None) {
      throw Fail(std::string("read failed: ") + CPLGetLastErrorMsg());
    }
    std::printf("%s[", b > 1 ? ", " : "");
    for (std::size_t i = 0; i < static_cast<std::size_t>(w) * static_cast<std::size_t>(h); ++i) {
      std::printf("%s%s", i ? "," : "", number(t, buf.data() + i * item).c_str());
    }
    std::printf("]");
  }
  std::printf("]}\n");
  GDALClose(ds);
  return 0;
}

long long block_offset(const std::string& path, int k, int* nblocks) {
  GDALAllRegister();
  GDALDatasetH ds = GDALOpen(path.c_str(), GA_ReadOnly);
  if (ds == nullptr) throw Fail("cannot open " + path);
  GDALRasterBandH band = GDALGetRasterBand(ds, 1);
  int bx = 0, by = 0;
  GDALGetBlockSize(band, &bx, &by);
  const int per_row = (GDALGetRasterXSize(ds) + bx - 1) / bx;
  const int rows = (GDALGetRasterYSize(ds) + by - 1) / by;
  *nblocks = per_row * rows;
  if (k >= *nblocks) throw Fail("no block " + std::to_string(k));
  const std::string key =
      "BLOCK_OFFSET_" + std::to_string(k % per_row) + "_" + std::to_string(k / per_row);
  const char* off = GDALGetMetadataItem(band, key.c_str(), "TIFF");
  if (off == nullptr) throw Fail("no " + key + " (a GeoTIFF written with data?)");
  const long long v = std::atoll(off);
  GDALClose(ds);
  return v;
}

long long block_size(const std::string& path, int k) {
  GDALDatasetH ds = GDALOpen(path.c_str(), GA_ReadOnly);
  GDALRasterBandH band = GDALGetRasterBand(ds, 1);
  int bx = 0, by = 0;
  GDALGetBlockSize(band, &bx, &by);
  const int per_row = (GDALGetRasterXSize(ds) + bx - 1) / bx;
  const std::string key =
      "BLOCK_SIZE_" + std::to_string(k % per_row) + "_" + std::to_string(k / per_row);
  const char* s = GDALGetMetadataItem(band, key.c_str(), "TIFF");
  const long long v = s != nullptr ? std::atoll(s) : 0;
  GDALClose(ds);
  return v;
}

int corrupt(const std::string& path, int from) {
  int n = 0;
  block_offset(path, from, &n);
  std::vector<std::pair<long long, long long>> spans;
  for (int k = from; k < n; ++k) spans.emplace_back(block_offset(path, k, &n), block_size(path, k));
  FILE* f = std::fopen(path.c_str(), "r+b");
  if (f == nullptr) throw Fail("cannot open for writing");
  for (const auto& [off, size] : spans) {
    std::vector<unsigned char> junk(static_cast<std::size_t>(size), 0xFF);
    std::fseek(f, static_cast<long>(off), SEEK_SET);
    std::fwrite(junk.data(), 1, junk.size(), f);
  }
  std::fclose(f);
  return 0;
}

/// The raster drivers of this GDAL that have Create (@p createcopy_only: CreateCopy, not Create),
/// as JSON: name and first extension ("" for none), one object per line inside a list.
int drivers(bool createcopy_only) {
  GDALAllRegister();
  std::printf("[");
  bool first = true;
  for (int i = 0; i < GDALGetDriverCount(); ++i) {
    GDALDriverH d = GDALGetDriver(i);
    const bool create = GDALGetMetadataItem(d, GDAL_DCAP_CREATE, nullptr) != nullptr;
    const bool copy = GDALGetMetadataItem(d, GDAL_DCAP_CREATECOPY, nullptr) != nullptr;
    if (GDALGetMetadataItem(d, GDAL_DCAP_RASTER, nullptr) == nullptr ||
        (createcopy_only ? create || !copy : !create)) {
      continue;
    }
    const char* exts = GDALGetMetadataItem(d, GDAL_DMD_EXTENSIONS, nullptr);
    std::string ext = exts != nullptr ? exts : "";
    ext = ext.substr(0, ext.find(' '));
    std::printf("%s\n  {\"name\": \"%s\", \"extension\": \"%s\"}", first ? "" : ",",
                GDALGetDriverShortName(d), ext.c_str());
    first = false;
  }
  std::printf("\n]\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CPLSetErrorHandler(CPLQuietErrorHandler);
  try {
    if (argc == 2 && std::strcmp(argv[1], "drivers") == 0) return drivers(false);
    if (argc == 3 && std::strcmp(argv[1], "drivers") == 0 &&
        std::strcmp(argv[2], "--createcopy") == 0) {
      return drivers(true);
    }
    if (argc < 3) {
      throw Fail("usage: vsr-test-raster make|dump|header|corrupt|block-offset PATH ... | drivers");
    }
    const std::string cmd = argv[1];
    if (cmd == "make") return make(argc, argv);
    if (cmd == "dump") return dump(argv[2]);
    if (cmd == "header") return dump(argv[2], false);
    if (cmd == "corrupt") {
      if (argc != 5 || std::strcmp(argv[3], "--from-block") != 0)
        throw Fail("corrupt PATH --from-block K");
      return corrupt(argv[2], std::atoi(argv[4]));
    }
    if (cmd == "block-offset") {
      int n = 0;
      std::printf("%lld\n", block_offset(argv[2], std::atoi(argv[3]), &n));
      return 0;
    }
    throw Fail("unknown command " + cmd);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vsr-test-raster: %s\n", e.what());
    return 1;
  }
}
