#include "pptrain/data/data.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

// Texts present on every Debian machine, in order of preference.
const char* const kDefaultTexts[] = {
    "/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2",
    "/usr/share/common-licenses/LGPL-2.1", "/usr/share/common-licenses/Apache-2.0"};

bool read_file(const std::string& path, std::string* contents) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) return false;  // reading one throws
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  contents->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

// A generator for (seed, stream, step): the same numbers on every rank, independent of torch's
// global generator. `stream` keeps the teacher, the inputs and the text offsets apart.
at::Generator make_generator(uint64_t seed, uint64_t stream, int step) {
  uint64_t value = seed * 0x9E3779B97F4A7C15ULL + stream * 1000003ULL + static_cast<uint64_t>(step);
  return at::detail::createCPUGenerator(value);
}

}  // namespace

Dataset::Dataset(const ModelOptions& model, const DataOptions& data) : model_(model), data_(data) {
  check_options(model_);
  PPTRAIN_CHECK(data_.min_seq_len == 0 || (model_.kind == "gpt" && data_.min_seq_len >= 1 &&
                                           data_.min_seq_len <= model_.seq_len),
                "--seq-len-range ", data_.min_seq_len, ":", model_.seq_len,
                model_.kind == "gpt" ? " is not MIN:MAX with 1 <= MIN <= MAX"
                                     : " applies to --model gpt only");
  PPTRAIN_CHECK(data_.microbatches >= 1, "--microbatches must be >= 1, got ", data_.microbatches);
  PPTRAIN_CHECK(data_.batch_size >= 1 && data_.batch_size % data_.microbatches == 0,
                "--batch-size must be a positive multiple of --microbatches (", data_.microbatches,
                "), got ", data_.batch_size);

  if (is_regression(model_)) {
    PPTRAIN_CHECK(data_.source == "default" || data_.source == "synthetic",
                  "the mlp model trains on synthetic data: --data must be 'synthetic' or ",
                  "'default', got '", data_.source, "'");
    // A fixed random teacher y = tanh(x A), A [D, D] scaled so x A has unit variance.
    auto generator = make_generator(data_.seed, 1, 0);
    teacher_ = torch::randn({model_.d_model, model_.d_model}, generator, torch::kFloat32) /
               std::sqrt(static_cast<double>(model_.d_model));
    return;
  }
  if (data_.source == "synthetic") return;

  std::string contents;
  if (data_.source == "default") {
    for (const char* candidate : kDefaultTexts) {
      if (read_file(candidate, &contents)) {
        path_ = candidate;
        break;
      }
    }
    PPTRAIN_CHECK(!path_.empty(), "--data default: none of the texts in /usr/share/common-licenses",
                  " (GPL-3, GPL-2, LGPL-2.1, Apache-2.0) is readable; pass --data PATH");
  } else {
    PPTRAIN_CHECK(read_file(data_.source, &contents), "--data: cannot read text file '",
                  data_.source, "'");
    path_ = data_.source;
  }
  PPTRAIN_CHECK(model_.vocab_size >= 256, "character-level text needs a vocabulary of 256 ",
                "byte values, got vocab size ", model_.vocab_size);
  PPTRAIN_CHECK(static_cast<int64_t>(contents.size()) >= model_.seq_len + 1, "--data '", path_,
                "' has ", contents.size(),
                " bytes; a sample needs at least seq_len + 1 = ", model_.seq_len + 1);
  text_ = torch::empty({static_cast<int64_t>(contents.size())}, torch::kInt64);
  auto* bytes = text_.data_ptr<int64_t>();
  for (size_t i = 0; i < contents.size(); ++i) bytes[i] = static_cast<unsigned char>(contents[i]);
}

Dataset::Batch Dataset::batch(int step) const {
  const int64_t n = data_.batch_size;
  if (is_regression(model_)) {
    auto generator = make_generator(data_.seed, 2, step);
    auto inputs = torch::randn({n, model_.d_model}, generator, torch::kFloat32);  // [N, D]
    return {inputs, torch::tanh(inputs.matmul(teacher_))};
  }
  int64_t tokens = model_.seq_len;
  if (data_.min_seq_len > 0) {
    auto lengths = make_generator(data_.seed, 4, step);
    tokens = torch::randint(data_.min_seq_len, model_.seq_len + 1, {1}, lengths, torch::kInt64)
                 .item<int64_t>();
  }
  auto generator = make_generator(data_.seed, 3, step);
  torch::Tensor sequences;  // int64 [N, T + 1]
  if (text_.defined()) {
    // Windows of T + 1 bytes at random offsets.
    auto offsets = torch::randint(0, text_.numel() - tokens, {n, 1}, generator, torch::kInt64);
    sequences = text_.index({offsets + torch::arange(tokens + 1, torch::kInt64)});
  } else {
    // Synthetic: arithmetic progressions start + stride * t (mod vocab), learnable from context.
    auto start = torch::randint(0, model_.vocab_size, {n, 1}, generator, torch::kInt64);
    auto stride = torch::randint(1, 8, {n, 1}, generator, torch::kInt64);
    sequences = (start + stride * torch::arange(tokens + 1, torch::kInt64)) % model_.vocab_size;
  }
  return {sequences.slice(1, 0, tokens).contiguous(),
          sequences.slice(1, 1, tokens + 1).contiguous()};
}

std::vector<torch::Tensor> Dataset::split(const torch::Tensor& t, int microbatches) {
  PPTRAIN_CHECK(microbatches >= 1, "microbatches must be >= 1, got ", microbatches);
  PPTRAIN_CHECK(t.dim() >= 1 && t.size(0) % microbatches == 0, "cannot split a batch of ",
                t.dim() >= 1 ? t.size(0) : 0, " samples into ", microbatches,
                " equal microbatches: the batch size must be a multiple of the microbatch count");
  std::vector<torch::Tensor> parts;
  for (auto& part : t.chunk(microbatches, 0)) parts.push_back(part.contiguous());
  return parts;
}

}  // namespace pptrain
