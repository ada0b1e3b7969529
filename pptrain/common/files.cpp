#include "pptrain/common/files.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "pptrain/common/check.h"

namespace pptrain {

std::string read_text_file(const std::string& path, const std::string& what) {
  std::error_code error;
  PPTRAIN_CHECK(!std::filesystem::is_directory(path, error), "cannot read ", what, " '", path,
                "': it is a folder, not a file");
  std::ifstream in(path, std::ios::binary);
  PPTRAIN_CHECK(in.good(), "cannot read ", what, " '", path, "'");
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  PPTRAIN_CHECK(!in.bad(), "cannot read ", what, " '", path, "'");
  return text;
}

void write_text_file(const std::string& path, const std::string& text, const std::string& what) {
  std::ofstream out(path, std::ios::binary);
  PPTRAIN_CHECK(out.good(), "cannot write ", what, " '", path, "'");
  out << text;
  out.close();
  PPTRAIN_CHECK(out.good(), "cannot write ", what, " '", path, "'");
}

std::string digest(const std::string& bytes) {
  uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

}  // namespace pptrain
