#include "pptrain/runtime/archive_file.h"

#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "pptrain/common/files.h"

namespace pptrain {

torch::Tensor ArchiveFile::keep(const torch::Tensor& tensor, bool copy) {
  if (!tensor.defined() || (!copy && tensor.is_cpu())) return tensor;
  // As the tensor itself would be written: the archive records requires_grad. A tensor on a
  // GPU is written from a host copy, so that a checkpoint loads on any device.
  copies.push_back(tensor.detach()
                       .to(torch::kCPU, /*non_blocking=*/false, /*copy=*/copy)
                       .requires_grad_(tensor.requires_grad()));
  return copies.back();
}

ArchiveFile ArchiveFile::of_bytes(std::string name, std::string bytes) {
  ArchiveFile file(std::move(name));
  file.archive.reset();
  file.bytes = std::make_shared<const std::string>(std::move(bytes));
  return file;
}

ArchiveFile archive_of(const std::string& name, const NamedTensors& tensors, bool copy) {
  ArchiveFile file(name);
  for (const auto& [key, tensor] : tensors) file.archive->write(key, file.keep(tensor, copy));
  return file;
}

std::string write_archive_file(const ArchiveFile& file, const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / file.name).string();
  if (!file.archive) {
    write_file_to_disk(path, *file.bytes, "checkpoint file");
    return path;
  }
  std::ostringstream bytes;
  try {
    file.archive->save_to(bytes);
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot write '" + path + "': " + e.what_without_backtrace());
  }
  write_file_to_disk(path, bytes.str(), "checkpoint file");
  return path;
}

}  // namespace pptrain
