#include "pptrain/runtime/tensor_bundle.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

// The first header word: catches a message that is not a header (a peer running other code).
constexpr int64_t kHeaderMagic = 0x70707462;  // "pptb"
// Code of an undefined tensor (a gradient that does not exist) in place of its dtype.
constexpr int64_t kUndefined = -1;

void check_name(const std::string& name) {
  PPTRAIN_CHECK(!name.empty() && name.find_first_of("/:") == std::string::npos,
                "a tensor's name in a bundle must be non-empty without '/' or ':', got '", name,
                "'");
}

std::string shape_text(const torch::Tensor& t) {
  std::string text = "[";
  for (int64_t d = 0; d < t.dim(); ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
  return text + "]";
}

}  // namespace

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return "float32";
    case torch::kFloat64:
      return "float64";
    case torch::kFloat16:
      return "float16";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kInt64:
      return "int64";
    case torch::kInt32:
      return "int32";
    case torch::kInt16:
      return "int16";
    case torch::kInt8:
      return "int8";
    case torch::kUInt8:
      return "uint8";
    case torch::kBool:
      return "bool";
    default:
      return c10::toString(dtype);
  }
}

TensorBundle::TensorBundle(torch::Tensor tensor) {
  if (tensor.defined()) tensors_.push_back(std::move(tensor));
}

TensorBundle::TensorBundle(std::vector<torch::Tensor> tensors) : tensors_(std::move(tensors)) {}

TensorBundle::TensorBundle(std::vector<std::pair<std::string, torch::Tensor>> named) {
  for (auto& [name, tensor] : named) add(name, std::move(tensor));
}

const torch::Tensor& TensorBundle::operator[](size_t i) const {
  PPTRAIN_CHECK(i < tensors_.size(), "tensor #", i, " of a bundle of ", tensors_.size(), " (",
                describe(), ")");
  return tensors_[i];
}

torch::Tensor& TensorBundle::operator[](size_t i) {
  PPTRAIN_CHECK(i < tensors_.size(), "tensor #", i, " of a bundle of ", tensors_.size(), " (",
                describe(), ")");
  return tensors_[i];
}

const torch::Tensor& TensorBundle::operator[](const std::string& name) const {
  const auto it = std::find(names_.begin(), names_.end(), name);
  PPTRAIN_CHECK(it != names_.end(), "no tensor '", name, "' in a bundle of ", describe());
  return tensors_[static_cast<size_t>(it - names_.begin())];
}

bool TensorBundle::contains(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

const torch::Tensor& TensorBundle::only() const {
  PPTRAIN_CHECK(tensors_.size() == 1, "one tensor expected, got ", describe());
  return tensors_[0];
}

void TensorBundle::push_back(torch::Tensor tensor) {
  PPTRAIN_CHECK(names_.empty(), "an unnamed tensor added to a bundle of named ones (", describe(),
                ")");
  tensors_.push_back(std::move(tensor));
}

void TensorBundle::add(const std::string& name, torch::Tensor tensor) {
  check_name(name);
  PPTRAIN_CHECK(names_.size() == tensors_.size(), "a named tensor '", name, "' added to a list (",
                describe(), ")");
  PPTRAIN_CHECK(!contains(name), "two tensors named '", name, "' in one bundle");
  names_.push_back(name);
  tensors_.push_back(std::move(tensor));
}

std::string TensorBundle::label(size_t i) const {
  return named() ? names_.at(i) : "#" + std::to_string(i);
}

std::string TensorBundle::describe() const {
  if (tensors_.empty()) return "no tensors";
  std::string text;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const torch::Tensor& t = tensors_[i];
    text += (i ? ", " : "") + label(i) + " ";
    text +=
        t.defined() ? dtype_name(t.scalar_type()) + " " + shape_text(t) : std::string("undefined");
  }
  return text;
}

bool carries_gradient(const torch::Tensor& tensor) {
  return tensor.defined() && tensor.is_floating_point();
}

TensorBundle gradient_bundle(const TensorBundle& forward, const std::vector<torch::Tensor>& grads) {
  PPTRAIN_ASSERT(grads.size() == forward.size(), grads.size(), " gradients for ", forward.size(),
                 " tensors");
  TensorBundle out;
  for (size_t i = 0; i < forward.size(); ++i) {
    if (!carries_gradient(forward[i])) continue;
    if (forward.named()) {
      out.add(forward.names()[i], grads[i]);
    } else {
      out.push_back(grads[i]);
    }
  }
  return out;
}

std::vector<TensorBundle> split_bundle(const TensorBundle& bundle, int parts,
                                       const std::string& what) {
  std::vector<TensorBundle> out(bundle.empty() ? 0 : static_cast<size_t>(parts));
  for (size_t i = 0; i < bundle.size(); ++i) {
    const torch::Tensor& t = bundle[i];
    PPTRAIN_CHECK(t.defined() && t.dim() >= 1 && t.size(0) % parts == 0, "the ", what, " tensor ",
                  bundle.label(i), " has ", t.defined() && t.dim() >= 1 ? t.size(0) : 0,
                  " rows, which do not split into ", parts, " equal microbatches");
    const auto chunks = t.chunk(parts, 0);
    for (int p = 0; p < parts; ++p) {
      if (bundle.named()) {
        out[p].add(bundle.names()[i], chunks[p].contiguous());
      } else {
        out[p].push_back(chunks[p].contiguous());
      }
    }
  }
  return out;
}

int64_t bundle_bytes(const TensorBundle& bundle) {
  int64_t bytes = 0;
  for (const auto& t : bundle.tensors()) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return bytes;
}

namespace {

// Words: magic, count, named; then per tensor: dtype code (or kUndefined), dims, each size,
// the name's length in bytes and its bytes packed eight to a word.
torch::Tensor encode_header(const TensorBundle& bundle, const std::string& what) {
  std::vector<int64_t> words = {kHeaderMagic, static_cast<int64_t>(bundle.size()),
                                bundle.named() ? 1 : 0};
  for (size_t i = 0; i < bundle.size(); ++i) {
    const torch::Tensor& t = bundle[i];
    words.push_back(t.defined() ? static_cast<int64_t>(t.scalar_type()) : kUndefined);
    if (t.defined()) {
      words.push_back(t.dim());
      for (int64_t d = 0; d < t.dim(); ++d) words.push_back(t.size(d));
    }
    const std::string name = bundle.named() ? bundle.names()[i] : "";
    words.push_back(static_cast<int64_t>(name.size()));
    for (size_t c = 0; c < name.size(); c += 8) {
      int64_t packed = 0;
      std::memcpy(&packed, name.data() + c, std::min<size_t>(8, name.size() - c));
      words.push_back(packed);
    }
  }
  PPTRAIN_CHECK(static_cast<int64_t>(words.size()) <= kHeaderWords, what, " (", bundle.describe(),
                ") does not fit a message header of ", kHeaderWords,
                " words: fewer tensors, dimensions or shorter names");
  words.resize(kHeaderWords, 0);
  return torch::tensor(words, torch::kInt64);
}

// The names, dtypes and shapes a header announces, as a bundle of empty tensors of those
// shapes (undefined where it announces none).
TensorBundle decode_header(const torch::Tensor& header, const std::string& what) {
  const int64_t* w = header.data_ptr<int64_t>();
  int64_t at = 0;
  const auto next = [&]() {
    PPTRAIN_CHECK(at < kHeaderWords, what,
                  ": malformed message header (a peer running other code?)");
    return w[at++];
  };
  PPTRAIN_CHECK(next() == kHeaderMagic, what,
                ": the message is not a pptrain message header (a peer running other code?)");
  const int64_t count = next();
  const bool named = next() == 1;
  PPTRAIN_CHECK(count >= 0 && count < kHeaderWords, what, ": malformed message header");
  TensorBundle out;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t code = next();
    torch::Tensor tensor;
    if (code != kUndefined) {
      PPTRAIN_CHECK(code >= 0 && code < static_cast<int64_t>(c10::ScalarType::NumOptions), what,
                    ": malformed message header (dtype code ", code, ")");
      const int64_t dims = next();
      PPTRAIN_CHECK(dims >= 0 && dims < kHeaderWords, what, ": malformed message header");
      std::vector<int64_t> sizes;
      for (int64_t d = 0; d < dims; ++d) sizes.push_back(next());
      tensor = torch::empty(sizes, torch::dtype(static_cast<c10::ScalarType>(code)));
    }
    const int64_t length = next();
    PPTRAIN_CHECK(length >= 0 && length <= 8 * kHeaderWords, what, ": malformed message header");
    std::string name(static_cast<size_t>(length), '\0');
    for (int64_t c = 0; c < length; c += 8) {
      const int64_t packed = next();
      std::memcpy(name.data() + c, &packed, static_cast<size_t>(std::min<int64_t>(8, length - c)));
    }
    if (named) {
      out.add(name, tensor);
    } else {
      out.push_back(tensor);
    }
  }
  return out;
}

}  // namespace

PendingComm send_bundle(Transport& transport, const TensorBundle& bundle, int peer, int tag,
                        const std::string& what, int64_t* bytes_sent) {
  auto parts = std::make_shared<std::vector<PendingComm>>();
  const torch::Tensor header = encode_header(bundle, what);
  parts->push_back(transport.send(header, peer, tag));
  int64_t bytes = 0;  // of the tensors: the header is the message's fixed cost
  for (const auto& tensor : bundle.tensors()) {
    if (!tensor.defined() || tensor.numel() == 0) continue;  // the header says it all
    const torch::Tensor data = tensor.detach().contiguous();
    parts->push_back(transport.send(data, peer, tag));
    bytes += data.numel() * static_cast<int64_t>(data.element_size());
  }
  if (bytes_sent) *bytes_sent += bytes;
  return PendingComm(
      [parts] {
        for (auto& part : *parts) part.wait();
      },
      header);
}

BundleReceive::BundleReceive(Transport& transport, int peer, int tag)
    : transport_(&transport),
      peer_(peer),
      tag_(tag),
      header_(transport.recv(torch::empty({kHeaderWords}, torch::kInt64), peer, tag)) {}

TensorBundle BundleReceive::finish(const std::string& what) {
  PPTRAIN_ASSERT(transport_ != nullptr, "finish() of a receive never posted");
  header_.wait();
  TensorBundle bundle = decode_header(header_.tensor(), what);
  // The sends follow the header in order on the same tag, and so do the receives.
  std::vector<PendingComm> parts;
  for (const auto& tensor : bundle.tensors()) {
    if (tensor.defined() && tensor.numel() > 0) {
      parts.push_back(transport_->recv(tensor, peer_, tag_));
    }
  }
  for (auto& part : parts) part.wait();
  transport_ = nullptr;
  return bundle;
}

}  // namespace pptrain
