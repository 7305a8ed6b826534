// SPDX-License-Identifier: Apache-2.0
// The one writer of every output (outputs.hpp, files/output_file.hpp) as each of its users
// reaches it: a target that is a FIFO or a device is never replaced (write_file_atomically,
// dump_memory_snapshot), a target is never a kept file by any spelling, and a message never
// names a private temporary.
#include "files/output_file.hpp"
#include "temp_dir.hpp"

#include <vibespatial/raster/memory_history.hpp>
#include <vibespatial/raster/outputs.hpp>

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

using namespace vibespatial::raster;
using vsr_test::TempDir;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

mode_t type_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & S_IFMT;
}

/// The entries of @p dir (no temporary may be left).
std::vector<std::string> names_in(const TempDir& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// Every writer of the library, writing @p path with overwrite.
const std::vector<std::pair<const char*, std::function<void(const std::string&)>>>& writers() {
  static const std::vector<std::pair<const char*, std::function<void(const std::string&)>>> w = {
      {"write_file_atomically", [](const std::string& p) { write_file_atomically(p, "x", true); }},
      {"dump_memory_snapshot", [](const std::string& p) { dump_memory_snapshot(p, true); }},
      {"check_output_path", [](const std::string& p) { check_output_path(p, true); }},
  };
  return w;
}

}  // namespace

TEST_CASE("a FIFO or a device is never replaced by any writer, with overwrite") {
  TempDir dir("vsr-target");
  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // A copy of /dev/null (character device 1:3): the system's would be lost as root.
  const std::string null_copy = dir.file("null");
  const bool device = ::mknod(null_copy.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
  for (const auto& [name, write] : writers()) {
    CAPTURE(name);
    try {
      write(fifo);
      FAIL("a FIFO was written");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("not a regular file") != std::string::npos);
    }
    CHECK(type_of(fifo) == S_IFIFO);
    if (device) {
      CHECK_THROWS_AS(write(null_copy), std::invalid_argument);
      CHECK(type_of(null_copy) == S_IFCHR);
    }
    CHECK_THROWS_AS(write(dir.path.string()), std::invalid_argument);  // a directory
  }
  const std::vector<std::string> left =
      device ? std::vector<std::string>{"null", "pipe"} : std::vector<std::string>{"pipe"};
  CHECK(names_in(dir) == left);
}

TEST_CASE("the snapshot's errors are typed as the other outputs'") {
  TempDir dir("vsr-target");
  const std::string path = dir.file("snap.pickle");
  dump_memory_snapshot(path);
  const std::string before = read_all(path);
  try {
    dump_memory_snapshot(path);
    FAIL("an existing snapshot was replaced");
  } catch (const std::system_error& e) {
    CHECK(e.code() == std::errc::file_exists);
    CHECK(std::string(e.what()).rfind("dump_memory_snapshot: ", 0) == 0);
  }
  CHECK(read_all(path) == before);
  try {
    dump_memory_snapshot(dir.file("missing/snap.pickle"));
    FAIL("wrote into a missing directory");
  } catch (const std::system_error& e) {
    CHECK(e.code() == std::errc::no_such_file_or_directory);
  }
  // A symbolic link is followed: the file it names is written, the link stays.
  const std::string link = dir.file("link.pickle");
  std::filesystem::create_symlink("made.pickle", link);
  dump_memory_snapshot(link);
  CHECK(type_of(link) == S_IFLNK);
  CHECK(read_all(dir.file("made.pickle")).substr(0, 2) == std::string("\x80\x02", 2));
  CHECK(names_in(dir) == std::vector<std::string>{"link.pickle", "made.pickle", "snap.pickle"});
}

TEST_CASE("a target is never a kept file, by any spelling") {
  TempDir dir("vsr-target");
  const std::string in = dir.file("in.tif");
  write_text(in, "input");
  std::filesystem::create_symlink("in.tif", dir.file("link.tif"));
  std::filesystem::create_hard_link(in, dir.file("hard.tif"));
  std::filesystem::create_directory(dir.file("sub"));
  const std::vector<KeptFile> kept = {{"the input", in}, {"the output", dir.file("out.tif")}};
  for (const std::string& spelling :
       {in, dir.file("link.tif"), dir.file("hard.tif"), dir.file("./in.tif"),
        dir.file("sub/../in.tif"), dir.file("out.tif"), dir.file("./sub/../out.tif")}) {
    CAPTURE(spelling);
    CHECK(detail::same_file(spelling, spelling));
    try {
      check_output_path(spelling, true, kept);
      FAIL("a kept file would be replaced");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("the same file as the") != std::string::npos);
    }
    CHECK_THROWS_AS(write_file_atomically(spelling, "x", true, kept), std::invalid_argument);
  }
  // A link whose file does not exist yet is the file it would make.
  std::filesystem::create_symlink("out.tif", dir.file("dangling.tif"));
  CHECK(detail::same_file(dir.file("dangling.tif"), dir.file("out.tif")));
  CHECK_THROWS_AS(check_output_path(dir.file("dangling.tif"), true, kept), std::invalid_argument);
  CHECK(read_all(in) == "input");
  CHECK_FALSE(std::filesystem::exists(dir.file("out.tif")));
  // Other files are written, through the same rules.
  CHECK_FALSE(detail::same_file(in, dir.file("other.tif")));
  write_file_atomically(dir.file("other.tif"), "other", false, kept);
  CHECK(read_all(dir.file("other.tif")) == "other");
  // Through the dangling link: the file it names is made, the link stays.
  write_file_atomically(dir.file("dangling.tif"), "made", false);
  CHECK(type_of(dir.file("dangling.tif")) == S_IFLNK);
  CHECK(read_all(dir.file("out.tif")) == "made");
}

TEST_CASE("messages name the target, never a private temporary") {
  TempDir dir("vsr-target");
  const std::string target = dir.file("out.tif");
  detail::PendingOutput pending(target, true, "writer");
  const std::string& temp = pending.directory();
  CHECK(temp.find(".vsr-") != std::string::npos);
  CHECK(detail::PendingOutput::without_temporaries("open " + pending.path() + ": Bad value") ==
        "open " + target + ": Bad value");
  CHECK(detail::PendingOutput::without_temporaries("_TIFFVSetField:" + temp +
                                                   "/stage.tif: Bad value") ==
        "_TIFFVSetField:" + target + ": Bad value");
  CHECK(detail::PendingOutput::without_temporaries("sidecar " + temp + "/data/out.tif.aux.xml") ==
        "sidecar " + dir.file("out.tif.aux.xml"));
  CHECK(detail::PendingOutput::without_temporaries("nothing of it") == "nothing of it");
  // A commit that fails names the target only.
  try {
    pending.commit();  // nothing was written
    FAIL("an empty output was committed");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    CHECK(what.rfind("writer: cannot write '" + target + "'", 0) == 0);
    CHECK(what.find(".vsr-") == std::string::npos);
  }
}
