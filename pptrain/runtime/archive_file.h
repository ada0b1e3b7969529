// A file of a checkpoint held in memory until it is written: a torch archive over tensors that
// nothing changes meanwhile (copies of them, for a save written while training goes on).
//
//   ArchiveFile file = archive_of("in_flight_rank0.pt", state, /*copy=*/true);
//   write_archive_file(file, "ckpt.partial");   // later, from any thread
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pptrain {

using NamedTensors = std::map<std::string, torch::Tensor>;

struct ArchiveFile {
  ArchiveFile(std::string name)
      : name(std::move(name)), archive(std::make_shared<torch::serialize::OutputArchive>()) {}
  // A file whose bytes are made already (a Python module's state_dict, as torch.save wrote it).
  static ArchiveFile of_bytes(std::string name, std::string bytes);

  // `tensor` itself, or with `copy` a copy of it that later training leaves alone (held in
  // `copies` as well: torch's pickler writes a tensor held only by the archive otherwise than
  // one held elsewhere too, and a background save's files are to be the synchronous ones'). A
  // tensor on a GPU is always copied, to the host: a checkpoint then loads on any device.
  torch::Tensor keep(const torch::Tensor& tensor, bool copy);

  std::string name;                                          // in the checkpoint folder
  std::shared_ptr<torch::serialize::OutputArchive> archive;  // null for of_bytes()
  std::vector<torch::Tensor> copies;
  std::shared_ptr<const std::string> bytes;  // of_bytes()'s
};

// A file of `tensors` (each keep(tensor, copy)) under their names.
ArchiveFile archive_of(const std::string& name, const NamedTensors& tensors, bool copy);

// Serializes `file` and writes it into folder `dir`, on the disk before it returns
// (write_file_to_disk: std::runtime_error naming the file and the room left when it cannot).
// Returns the file's path.
std::string write_archive_file(const ArchiveFile& file, const std::string& dir);

}  // namespace pptrain
