#include "pptrain/common/files.h"

#include <fstream>
#include <iterator>

#include "pptrain/common/check.h"

namespace pptrain {

std::string read_text_file(const std::string& path, const std::string& what) {
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

}  // namespace pptrain
