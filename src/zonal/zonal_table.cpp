// SPDX-License-Identifier: Apache-2.0
// The zonal statistics' names and the table's text forms (zonal.hpp).
#include <vibespatial/raster/outputs.hpp>
#include <vibespatial/raster/zonal.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <set>

namespace vibespatial::raster {

namespace {

std::string number(double v) {
  if (std::isnan(v) || std::isinf(v)) return "";
  if (v == std::trunc(v) && std::abs(v) < 1e15) {
    char buf[32];
    const auto res = std::to_chars(buf, buf + sizeof buf, static_cast<long long>(v));
    return std::string(buf, res.ptr);
  }
  char buf[40];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, 17);
  return std::string(buf, res.ptr);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      static const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

std::string zone_text(const ZoneIds& z, std::size_t row, bool json) {
  switch (z.kind) {
    case ZoneIds::Kind::integer:
      return std::to_string(z.integers[row]);
    case ZoneIds::Kind::real: {
      const std::string n = number(z.reals[row]);
      return n.empty() ? (json ? "null" : "") : n;
    }
    case ZoneIds::Kind::text:
      return json ? json_string(z.texts[row]) : csv_field(z.texts[row]);
  }
  return {};
}

}  // namespace

std::string_view to_string(PixelRule rule) noexcept {
  switch (rule) {
    case PixelRule::fractional:
      return "fractional";
    case PixelRule::center:
      return "center";
    case PixelRule::all_touched:
      return "all-touched";
  }
  return "fractional";
}

PixelRule pixel_rule_from_string(std::string_view text) {
  if (text == "fractional") return PixelRule::fractional;
  if (text == "center") return PixelRule::center;
  if (text == "all-touched" || text == "all_touched") return PixelRule::all_touched;
  throw ZonalInputError("zonal_stats: unknown pixel rule '" + std::string(text) +
                        "' (fractional, center or all-touched)");
}

const std::vector<std::string>& zonal_stat_names() {
  static const std::vector<std::string> names = {
      "count",    "sum",           "mean",         "min",       "max",      "stdev",
      "variance", "median",        "quantile",     "majority",  "minority", "variety",
      "frac",     "weighted_mean", "weighted_sum", "cell_count"};
  return names;
}

std::vector<std::string> parse_zonal_stats(std::string_view list) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t end = std::min(list.find(',', pos), list.size());
    std::string name(list.substr(pos, end - pos));
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    pos = end + 1;
    if (name.empty()) {
      if (end == list.size() && out.empty()) break;
      throw ZonalInputError("zonal_stats: an empty statistic name in '" + std::string(list) + "'");
    }
    const auto& known = zonal_stat_names();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string all;
      for (const auto& k : known) all += (all.empty() ? "" : ", ") + k;
      throw ZonalInputError("zonal_stats: unknown statistic '" + name + "' (known: " + all + ")");
    }
    if (!seen.insert(name).second) {
      throw ZonalInputError("zonal_stats: statistic '" + name + "' given twice");
    }
    out.push_back(std::move(name));
  }
  if (out.empty()) throw ZonalInputError("zonal_stats: no statistics given");
  return out;
}

std::size_t ZoneIds::size() const noexcept {
  switch (kind) {
    case Kind::integer:
      return integers.size();
    case Kind::real:
      return reals.size();
    case Kind::text:
      return texts.size();
  }
  return 0;
}

const std::vector<double>& ZonalTable::column(std::string_view stat) const {
  for (std::size_t s = 0; s < stat_names.size(); ++s) {
    if (stat_names[s] == stat) return values[s];
  }
  throw std::out_of_range("ZonalTable: no column '" + std::string(stat) + "'");
}

std::string zonal_table_json(const ZonalTable& t) {
  std::string out = "[";
  for (std::size_t row = 0; row < t.rows(); ++row) {
    out += row == 0 ? "\n  {" : ",\n  {";
    out +=
        "\"zone\": " + zone_text(t.zone, row, true) + ", \"band\": " + std::to_string(t.band[row]);
    for (std::size_t s = 0; s < t.stat_names.size(); ++s) {
      out += ", \"" + t.stat_names[s] + "\": ";
      if (t.stat_names[s] == "frac") {
        if (t.frac[row].empty()) {
          out += "null";
          continue;
        }
        out += "{";
        for (std::size_t k = 0; k < t.frac[row].size(); ++k) {
          out += (k == 0 ? "\"" : ", \"") + number(t.frac[row][k].first) +
                 "\": " + number(t.frac[row][k].second);
        }
        out += "}";
        continue;
      }
      const std::string n = number(t.values[s][row]);
      out += n.empty() ? "null" : n;
    }
    out += "}";
  }
  out += t.rows() == 0 ? "]\n" : "\n]\n";
  return out;
}

std::string zonal_table_csv(const ZonalTable& t) {
  std::string out = "zone,band";
  for (const std::string& s : t.stat_names) out += "," + s;
  out += "\n";
  for (std::size_t row = 0; row < t.rows(); ++row) {
    out += zone_text(t.zone, row, false) + "," + std::to_string(t.band[row]);
    for (std::size_t s = 0; s < t.stat_names.size(); ++s) {
      out += ",";
      if (t.stat_names[s] == "frac") {
        std::string f;
        for (const auto& [v, share] : t.frac[row]) {
          f += (f.empty() ? "" : ";") + number(v) + ":" + number(share);
        }
        out += f.empty() ? "" : "\"" + f + "\"";
        continue;
      }
      out += number(t.values[s][row]);
    }
    out += "\n";
  }
  return out;
}

void write_zonal_table(const ZonalTable& table, const std::string& path, bool overwrite,
                       const std::vector<KeptFile>& kept) {
  std::string ext;
  if (const auto dot = path.find_last_of('.');
      dot != std::string::npos && path.find('/', dot) == std::string::npos) {
    ext = path.substr(dot + 1);
    std::transform(ext.begin(), ext.end(), ext.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  }
  std::string text;
  if (ext == "json") {
    text = zonal_table_json(table);
  } else if (ext == "csv") {
    text = zonal_table_csv(table);
  } else {
    throw ZonalInputError("write_zonal_table: '" + path +
                          "' must end in .json or .csv (the table's format comes from it)");
  }
  write_file_atomically(path, text, overwrite, kept);
}

}  // namespace vibespatial::raster
