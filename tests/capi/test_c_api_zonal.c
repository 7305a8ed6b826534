/* SPDX-License-Identifier: Apache-2.0 */
/* The C ABI's zonal statistics from C (c99, -pedantic): vsr_zonal_stats over an ASCII grid and a
 * GeoJSON layer written here as text, the JSON text, a CSV file written all or nothing, and the
 * refusals. Exits 77 (skip) in a build without GDAL. */
#define _GNU_SOURCE 1 /* mkdtemp, access */
#include <vibespatial/raster/c_api.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_checks = 0;

#define CHECK(cond)                                                                               \
  do {                                                                                            \
    ++g_checks;                                                                                   \
    if (!(cond)) {                                                                                \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: \"%s\"\n", __FILE__, __LINE__, #cond, \
              vsr_last_error_message());                                                          \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

#define CHECK_OK(call)                          \
  do {                                          \
    vsr_status check_ok_status_ = (call);       \
    CHECK(check_ok_status_ == VSR_OK);          \
    CHECK(vsr_last_error_message()[0] == '\0'); \
  } while (0)

#define CHECK_FAILS(call, status, function)                                             \
  do {                                                                                  \
    vsr_status check_fails_status_ = (call);                                            \
    CHECK(check_fails_status_ == (status));                                             \
    CHECK(strstr(vsr_last_error_message(), function ": ") == vsr_last_error_message()); \
  } while (0)

static void write_text_file(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  CHECK(f != NULL);
  CHECK(fputs(text, f) >= 0);
  CHECK(fclose(f) == 0);
}

/* Zonal statistics of an ASCII grid over a GeoJSON layer: the JSON text, a CSV file written all
 * or nothing, and the refusals (a missing field, a bad statistic, a missing file). */
static void test_zonal_stats(void) {
  char dir[] = "/tmp/vsr-capi-zonal-XXXXXX";
  char raster[128], zones[128], csv[128], bad[128];
  vsr_zonal_options o;
  char* text = NULL;
  size_t len = 0;
  vsr_status st;
  CHECK(mkdtemp(dir) != NULL);
  snprintf(raster, sizeof raster, "%s/v.asc", dir);
  snprintf(zones, sizeof zones, "%s/z.geojson", dir);
  snprintf(csv, sizeof csv, "%s/out.csv", dir);
  snprintf(bad, sizeof bad, "%s/missing.gpkg", dir);
  write_text_file(raster,
                  "ncols 4\nnrows 4\nxllcorner 0\nyllcorner 0\ncellsize 1\nNODATA_value -9999\n"
                  "1 2 3 4\n5 6 7 8\n9 10 11 12\n13 14 -9999 16\n");
  write_text_file(
      zones,
      "{\"type\":\"FeatureCollection\",\"features\":["
      "{\"type\":\"Feature\",\"properties\":{\"id\":7},\"geometry\":{\"type\":\"Polygon\","
      "\"coordinates\":[[[0,2],[2,2],[2,4],[0,4],[0,2]]]}},"
      "{\"type\":\"Feature\",\"properties\":{\"id\":8},\"geometry\":{\"type\":\"Polygon\","
      "\"coordinates\":[[[1,0],[3,0],[3,1.5],[1,1.5],[1,0]]]}}]}");
  CHECK_OK(vsr_zonal_options_init(&o));
  CHECK(o.struct_size == sizeof o && o.quantile == 0.9);
  o.zone_field = "id";
  o.stats = "count,sum";
  st = vsr_zonal_stats(raster, zones, &o, NULL, 0, &text, &len);
  if (st != VSR_OK && strstr(vsr_last_error_message(), "without GDAL") != NULL) {
    printf("c-api-zonal: skipped (built without GDAL)\n");
    exit(77);
  }
  CHECK(st == VSR_OK);
  CHECK(text != NULL && strlen(text) == len);
  CHECK(strstr(text, "{\"zone\": 7, \"band\": 1, \"count\": 4, \"sum\": 14}") != NULL);
  /* cells 14 whole, 10 and 11 half, the nodata cell left out */
  CHECK(strstr(text, "{\"zone\": 8, \"band\": 1, \"count\": 2, \"sum\": 24.5}") != NULL);
  vsr_free_text(text);
  vsr_free_text(NULL);
  CHECK_OK(vsr_zonal_stats(raster, zones, &o, csv, 0, NULL, NULL));
  CHECK(remove(csv) == 0);
  o.zone_field = "nope";
  text = NULL;
  CHECK_FAILS(vsr_zonal_stats(raster, zones, &o, NULL, 0, &text, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_zonal_stats");
  CHECK(strstr(vsr_last_error_message(), "has no field 'nope'") != NULL);
  CHECK(text == NULL);
  o.zone_field = NULL;
  o.stats = "count,bogus";
  CHECK_FAILS(vsr_zonal_stats(raster, zones, &o, csv, 0, NULL, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_zonal_stats");
  CHECK(access(csv, F_OK) != 0); /* nothing written */
  CHECK_FAILS(vsr_zonal_stats(raster, bad, NULL, NULL, 0, &text, NULL), VSR_ERROR_IO,
              "vsr_zonal_stats");
  CHECK(vsr_last_io_errno() == ENOENT);
  CHECK_FAILS(vsr_zonal_stats(NULL, zones, NULL, NULL, 0, &text, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_zonal_stats");
  CHECK(remove(raster) == 0);
  CHECK(remove(zones) == 0);
  CHECK(rmdir(dir) == 0);
}

int main(void) {
  test_zonal_stats();
  printf("c-api-zonal: %d checks passed\n", g_checks);
  return 0;
}
