// SPDX-License-Identifier: Apache-2.0
// Polygon zones through OGR (zonal.hpp): layers of vector files, WKB, the CRS transformation,
// and zonal_stats_file, which opens the raster, the zones and the weights as files.
#include "io/gdal_common.hpp"

#include <vibespatial/raster/zonal.hpp>

#include <gdal.h>
#include <ogr_api.h>
#include <ogr_geometry.h>
#include <ogr_spatialref.h>
#include <ogrsf_frmts.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <system_error>

namespace vibespatial::raster {

namespace {

struct GeometryDeleter {
  void operator()(OGRGeometry* g) const { OGRGeometryFactory::destroyGeometry(g); }
};
using GeometryPtr = std::unique_ptr<OGRGeometry, GeometryDeleter>;

ZonePolygon polygon_of(const OGRPolygon& p) {
  ZonePolygon out;
  const auto ring_of = [](const OGRLinearRing* r) {
    ZoneRing ring;
    if (r == nullptr) return ring;
    ring.reserve(static_cast<std::size_t>(r->getNumPoints()));
    for (int i = 0; i < r->getNumPoints(); ++i) ring.emplace_back(r->getX(i), r->getY(i));
    return ring;
  };
  if (p.IsEmpty()) return out;
  out.push_back(ring_of(p.getExteriorRing()));
  for (int i = 0; i < p.getNumInteriorRings(); ++i) out.push_back(ring_of(p.getInteriorRing(i)));
  return out;
}

// The zone of @p g (owned; may be null), checked: @p where names it in messages.
ZoneGeometry zone_of(GeometryPtr g, OGRCoordinateTransformation* ct, const std::string& where) {
  ZoneGeometry zone;
  if (!g || g->IsEmpty()) return zone;
  const OGRwkbGeometryType type = wkbFlatten(g->getGeometryType());
  if (OGR_GT_IsCurve(type) || type == wkbPoint || type == wkbMultiPoint ||
      OGR_GT_IsSubClassOf(type, wkbMultiCurve)) {
    throw ZonalInputError("zonal_stats: " + where + " is a " +
                          std::string(OGRGeometryTypeToName(type)) +
                          ", not a polygon: zones must be polygons or multipolygons");
  }
  if (!OGR_GT_IsSurface(type) && !OGR_GT_IsSubClassOf(type, wkbMultiSurface)) {
    throw ZonalInputError("zonal_stats: " + where + " is a " +
                          std::string(OGRGeometryTypeToName(type)) +
                          ": zones must be polygons or multipolygons");
  }
  if (OGRGeometryFactory::haveGEOS()) {
    // GEOS says why through GDAL's warnings ("Self-intersection at or near point ...").
    detail::gdal::QuietErrors quiet;
    if (!g->IsValid()) {
      const std::string why = quiet.warnings();
      throw ZonalInputError("zonal_stats: " + where + " is not a valid polygon" +
                            (why.empty() ? std::string() : " (" + why + ")") +
                            ": repair it first, e.g. with ogr2ogr -makevalid");
    }
  }
  GeometryPtr multi(OGRGeometryFactory::forceToMultiPolygon(g.release()));
  if (ct != nullptr && multi->transform(ct) != OGRERR_NONE) {
    throw ZonalInputError("zonal_stats: " + where + " cannot be transformed to the raster's CRS" +
                          detail::gdal::gdal_message());
  }
  const auto* mp = multi->toMultiPolygon();
  for (const OGRPolygon* p : *mp) {
    ZonePolygon poly = polygon_of(*p);
    if (!poly.empty()) zone.push_back(std::move(poly));
  }
  return zone;
}

struct TransformDeleter {
  void operator()(OGRCoordinateTransformation* ct) const {
    OGRCoordinateTransformation::DestroyCT(ct);
  }
};

std::unique_ptr<OGRCoordinateTransformation, TransformDeleter> transform_to(
    const OGRSpatialReference* from, const std::string& target_crs) {
  if (from == nullptr || target_crs.empty()) return nullptr;
  OGRSpatialReference to;
  if (to.SetFromUserInput(target_crs.c_str()) != OGRERR_NONE) {
    throw ZonalInputError("zonal_stats: the raster's CRS is not one OGR understands");
  }
  OGRSpatialReference src(*from);
  src.SetAxisMappingStrategy(OAMS_TRADITIONAL_GIS_ORDER);
  to.SetAxisMappingStrategy(OAMS_TRADITIONAL_GIS_ORDER);
  if (src.IsSame(&to)) return nullptr;
  OGRCoordinateTransformation* ct = OGRCreateCoordinateTransformation(&src, &to);
  if (ct == nullptr) {
    throw ZonalInputError("zonal_stats: no transformation from the zones' CRS to the raster's" +
                          detail::gdal::gdal_message());
  }
  return std::unique_ptr<OGRCoordinateTransformation, TransformDeleter>(ct);
}

void require_file(const std::string& path, const char* what) {
  struct stat st {};
  if (path.rfind("/vsi", 0) != 0 && ::stat(path.c_str(), &st) != 0) {
    throw std::system_error(
        errno, std::generic_category(),
        std::string("zonal_stats: ") + what + " '" + detail::gdal::shown(path) + "'");
  }
}

struct DatasetDeleter {
  void operator()(GDALDataset* ds) const { GDALClose(ds); }
};
using VectorDataset = std::unique_ptr<GDALDataset, DatasetDeleter>;

VectorDataset open_vector(const std::string& path) {
  detail::gdal::register_drivers();
  detail::gdal::QuietErrors quiet;
  return VectorDataset(static_cast<GDALDataset*>(
      GDALOpenEx(path.c_str(), GDAL_OF_VECTOR | GDAL_OF_READONLY, nullptr, nullptr, nullptr)));
}

// Each feature's field value as an id column of the field's type (nulls: a real NaN column).
struct IdReader {
  int field = -1;
  OGRFieldType type = OFTInteger64;
  std::vector<std::optional<std::int64_t>> ints;
  std::vector<double> reals;
  std::vector<std::string> texts;
  void read(OGRFeature& f) {
    if (field < 0) {
      ints.emplace_back(f.GetFID());
    } else if (type == OFTInteger || type == OFTInteger64) {
      ints.push_back(f.IsFieldSetAndNotNull(field)
                         ? std::optional<std::int64_t>(f.GetFieldAsInteger64(field))
                         : std::nullopt);
    } else if (type == OFTReal) {
      reals.push_back(f.IsFieldSetAndNotNull(field) ? f.GetFieldAsDouble(field)
                                                    : std::numeric_limits<double>::quiet_NaN());
    } else {
      texts.emplace_back(f.IsFieldSetAndNotNull(field) ? f.GetFieldAsString(field) : "");
    }
  }
  ZoneIds ids() const {
    ZoneIds out;
    if (field >= 0 && type == OFTReal) {
      out.kind = ZoneIds::Kind::real;
      out.reals = reals;
    } else if (field >= 0 && type != OFTInteger && type != OFTInteger64) {
      out.kind = ZoneIds::Kind::text;
      out.texts = texts;
    } else {
      bool nulls = false;
      for (const auto& v : ints) nulls = nulls || !v;
      if (nulls) {
        out.kind = ZoneIds::Kind::real;
        for (const auto& v : ints) {
          out.reals.push_back(v ? static_cast<double>(*v)
                                : std::numeric_limits<double>::quiet_NaN());
        }
      } else {
        for (const auto& v : ints) out.integers.push_back(*v);
      }
    }
    return out;
  }
};

}  // namespace

ZoneSet read_zone_layer(const ZoneLayer& source, const std::string& target_crs) {
  require_file(source.path, "cannot open the zones");
  VectorDataset ds = open_vector(source.path);
  if (!ds || ds->GetLayerCount() == 0) {
    throw ZonalInputError("zonal_stats: '" + detail::gdal::shown(source.path) +
                          "' is not a vector file OGR opens (with a layer)");
  }
  OGRLayer* layer =
      source.layer.empty() ? ds->GetLayer(0) : ds->GetLayerByName(source.layer.c_str());
  if (layer == nullptr) {
    std::string names;
    for (int i = 0; i < ds->GetLayerCount(); ++i) {
      names += (i == 0 ? "" : ", ") + std::string(ds->GetLayer(i)->GetName());
    }
    throw ZonalInputError("zonal_stats: '" + detail::gdal::shown(source.path) + "' has no layer '" +
                          detail::gdal::shown(source.layer) + "' (layers: " + names + ")");
  }
  IdReader ids;
  OGRFeatureDefn* defn = layer->GetLayerDefn();
  if (!source.zone_field.empty()) {
    ids.field = defn->GetFieldIndex(source.zone_field.c_str());
    if (ids.field < 0) {
      std::string names;
      for (int i = 0; i < defn->GetFieldCount(); ++i) {
        names += (i == 0 ? "" : ", ") + std::string(defn->GetFieldDefn(i)->GetNameRef());
      }
      throw ZonalInputError("zonal_stats: layer '" + std::string(layer->GetName()) +
                            "' has no field '" + detail::gdal::shown(source.zone_field) +
                            "' (fields: " + (names.empty() ? "none" : names) + ")");
    }
    ids.type = defn->GetFieldDefn(ids.field)->GetType();
  }
  auto ct = transform_to(layer->GetSpatialRef(), target_crs);
  ZoneSet zones;
  layer->ResetReading();
  for (auto& feature : *layer) {
    const std::string where = "feature " + std::to_string(feature->GetFID()) + " of layer '" +
                              std::string(layer->GetName()) + "'";
    zones.geometries.push_back(zone_of(GeometryPtr(feature->StealGeometry()), ct.get(), where));
    ids.read(*feature);
  }
  if (zones.geometries.empty()) {
    throw ZonalInputError("zonal_stats: layer '" + std::string(layer->GetName()) + "' of '" +
                          detail::gdal::shown(source.path) + "' has no features");
  }
  zones.ids = ids.ids();
  return zones;
}

ZoneSet zones_from_wkb(const std::vector<std::string>& wkb, ZoneIds ids) {
  detail::gdal::register_drivers();
  ZoneSet zones;
  for (std::size_t i = 0; i < wkb.size(); ++i) {
    OGRGeometry* g = nullptr;
    if (OGRGeometryFactory::createFromWkb(wkb[i].data(), nullptr, &g, wkb[i].size()) !=
        OGRERR_NONE) {
      throw ZonalInputError("zonal_stats: geometry " + std::to_string(i) + " is not valid WKB");
    }
    zones.geometries.push_back(zone_of(GeometryPtr(g), nullptr, "geometry " + std::to_string(i)));
  }
  zones.ids = std::move(ids);
  return zones;
}

namespace {

struct FileRun {
  RasterFileSource values;
  std::optional<RasterFileSource> weights;
  ZonalOptions options;
  FileRun(const std::string& raster_path, const ZonalOptions& o, const std::string& weights_path)
      : values(raster_path, o.open, o.bands), options(o) {
    options.bands.clear();
    if (!weights_path.empty()) weights.emplace(weights_path, o.open);
  }
  RasterFileSource* weights_source() { return weights ? &*weights : nullptr; }
  // Rows name the file's bands, not the positions among those selected.
  ZonalTable relabel(ZonalTable t) const {
    for (int& b : t.band) b = values.bands().at(static_cast<std::size_t>(b - 1));
    return t;
  }
};

}  // namespace

ZonalTable zonal_stats_file(const std::string& raster_path, const ZoneSet& zones,
                            const ZonalOptions& options, const std::string& weights_path) {
  FileRun run(raster_path, options, weights_path);
  return run.relabel(zonal_stats(run.values, zones, run.options, run.weights_source()));
}

ZonalTable zonal_stats_file(const std::string& raster_path, const ZoneFile& zones,
                            const ZonalOptions& options, const std::string& weights_path) {
  require_file(zones.path, "cannot open the zones");
  bool vector = false;
  {
    VectorDataset ds = open_vector(zones.path);
    vector = ds && ds->GetLayerCount() > 0;
  }
  FileRun run(raster_path, options, weights_path);
  if (vector) {
    const ZoneSet set =
        read_zone_layer({zones.path, zones.layer, zones.zone_field}, run.values.metadata().crs);
    return run.relabel(zonal_stats(run.values, set, run.options, run.weights_source()));
  }
  RasterFileSource zone_raster(zones.path, options.open);
  return run.relabel(zonal_stats(run.values, zone_raster, run.options, run.weights_source()));
}

}  // namespace vibespatial::raster
