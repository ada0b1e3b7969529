#include "pptrain/common/files.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

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

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return text;
}

namespace {

// What a failed write says: the reason, and the room left where the file was going.
[[noreturn]] void fail_to_write(const std::string& path, const std::string& what, int error) {
  std::string message = "cannot write " + what + " '" + path + "': " + std::strerror(error);
  struct statvfs fs {};
  const std::string folder = std::filesystem::path(path).parent_path().string();
  if (::statvfs(folder.empty() ? "." : folder.c_str(), &fs) == 0) {
    message += " (" + format_bytes(static_cast<double>(fs.f_bavail) * fs.f_frsize) + " free of " +
               format_bytes(static_cast<double>(fs.f_blocks) * fs.f_frsize) +
               " on its file system)";
  }
  throw std::runtime_error(message);
}

}  // namespace

void write_file_to_disk(const std::string& path, const std::string& bytes,
                        const std::string& what) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_to_write(path, what, errno);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      ::close(fd);
      fail_to_write(path, what, error);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int error = errno;
    ::close(fd);
    fail_to_write(path, what, error);
  }
  if (::close(fd) != 0) fail_to_write(path, what, errno);
}

void sync_folder(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
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
