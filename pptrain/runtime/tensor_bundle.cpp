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

// Message layout, in int64 words then bytes: magic, the message's length in bytes, the count of
// tensors, whether they are named; per tensor its dtype code (or kUndefined), and when defined
// its dims and sizes; its name's length in bytes and the name packed eight bytes to a word. The
// header is padded to kAlign bytes, and so is each tensor's data after it, in order.
constexpr int64_t kAlign = 64;
static_assert(kNoticeBytes == kAlign, "a notice is one aligned block");

int64_t aligned(int64_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

int64_t data_bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

std::vector<int64_t> header_words(const TensorBundle& bundle) {
  std::vector<int64_t> words = {kHeaderMagic, 0, static_cast<int64_t>(bundle.size()),
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
  return words;
}

// The length of the message of `bundle` with the header `words`, and where each tensor's data
// starts in it.
int64_t layout(const TensorBundle& bundle, const std::vector<int64_t>& words,
               std::vector<int64_t>* offsets) {
  int64_t length = aligned(static_cast<int64_t>(words.size()) * 8);
  for (const auto& t : bundle.tensors()) {
    if (offsets) offsets->push_back(length);
    length += aligned(data_bytes(t));
  }
  return length;
}

// The whole message of `bundle`: header and data, in one uint8 tensor.
torch::Tensor pack(const TensorBundle& bundle) {
  std::vector<int64_t> words = header_words(bundle);
  std::vector<int64_t> offsets;
  const int64_t length = layout(bundle, words, &offsets);
  words[1] = length;
  torch::Tensor message = torch::empty({length}, torch::kUInt8);
  uint8_t* base = message.data_ptr<uint8_t>();
  std::memcpy(base, words.data(), words.size() * 8);
  for (size_t i = 0; i < bundle.size(); ++i) {
    const torch::Tensor& t = bundle[i];
    if (data_bytes(t) == 0) continue;
    torch::from_blob(base + offsets[i], t.sizes(), torch::dtype(t.scalar_type())).copy_(t.detach());
  }
  return message;
}

// The tensors a whole message holds: views of its bytes (which they keep alive), under the
// names, dtypes and shapes of its header.
TensorBundle unpack(const torch::Tensor& message, const std::string& what) {
  const int64_t length = message.numel();
  const auto* w = reinterpret_cast<const int64_t*>(message.data_ptr<uint8_t>());
  const int64_t words = length / 8;
  int64_t at = 0;
  const auto next = [&]() {
    PPTRAIN_CHECK(at < words, what, ": malformed message header (a peer running other code?)");
    return w[at++];
  };
  at = 2;  // magic and length: checked by the receive
  const int64_t count = next();
  const bool named = next() == 1;
  PPTRAIN_CHECK(count >= 0 && count < words, what, ": malformed message header");
  struct Entry {
    std::string name;
    c10::ScalarType dtype = torch::kFloat32;
    std::vector<int64_t> sizes;
    bool defined = false;
  };
  std::vector<Entry> entries(static_cast<size_t>(count));
  for (Entry& e : entries) {
    const int64_t code = next();
    if (code != kUndefined) {
      PPTRAIN_CHECK(code >= 0 && code < static_cast<int64_t>(c10::ScalarType::NumOptions), what,
                    ": malformed message header (dtype code ", code, ")");
      e.defined = true;
      e.dtype = static_cast<c10::ScalarType>(code);
      const int64_t dims = next();
      PPTRAIN_CHECK(dims >= 0 && dims < words, what, ": malformed message header");
      for (int64_t d = 0; d < dims; ++d) e.sizes.push_back(next());
    }
    const int64_t name_length = next();
    PPTRAIN_CHECK(name_length >= 0 && name_length <= 8 * words, what, ": malformed message header");
    e.name.assign(static_cast<size_t>(name_length), '\0');
    for (int64_t c = 0; c < name_length; c += 8) {
      const int64_t packed = next();
      std::memcpy(e.name.data() + c, &packed,
                  static_cast<size_t>(std::min<int64_t>(8, name_length - c)));
    }
  }
  int64_t offset = aligned(at * 8);
  uint8_t* base = message.data_ptr<uint8_t>();
  TensorBundle out;
  for (const Entry& e : entries) {
    torch::Tensor tensor;
    if (e.defined) {
      int64_t numel = 1;
      for (int64_t size : e.sizes) numel *= size;
      const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(e.dtype));
      PPTRAIN_CHECK(numel >= 0 && offset + bytes <= length, what,
                    ": the message is shorter than its header says");
      tensor = torch::from_blob(
          base + offset, e.sizes, [keep = message](void*) {}, torch::dtype(e.dtype));
      offset += aligned(bytes);
    }
    if (named) {
      out.add(e.name, tensor);
    } else {
      out.push_back(tensor);
    }
  }
  return out;
}

// The magic and length words a message or notice begins with; UserError naming `what` when it
// does not begin with them.
int64_t announced_length(const torch::Tensor& received, const std::string& what) {
  const auto* w = reinterpret_cast<const int64_t*>(received.data_ptr<uint8_t>());
  PPTRAIN_CHECK(received.numel() >= 16 && w[0] == kHeaderMagic && w[1] >= kNoticeBytes, what,
                ": the message is not a pptrain message (a peer running other code?)");
  return w[1];
}

}  // namespace

int64_t message_bytes(const TensorBundle& bundle) {
  return layout(bundle, header_words(bundle), nullptr);
}

PendingComm send_bundle(Transport& transport, const TensorBundle& bundle, int peer, int tag,
                        MessageLengths& lengths, int64_t* bytes_sent) {
  const torch::Tensor message = pack(bundle);
  const int64_t length = message.numel();
  int64_t& expected = lengths.sent.try_emplace(tag, kNoticeBytes).first->second;
  PendingComm notice;
  if (expected != length) {  // the receive expects `expected` bytes: tell it the new length
    torch::Tensor words = torch::zeros({expected}, torch::kUInt8);
    const int64_t head[2] = {kHeaderMagic, length};
    std::memcpy(words.data_ptr<uint8_t>(), head, sizeof(head));
    notice = transport.send(words, peer, tag);
    expected = length;
  }
  PendingComm sent = transport.send(message, peer, tag);
  if (bytes_sent) *bytes_sent += bundle_bytes(bundle);
  if (!notice.pending()) return sent;
  auto parts =
      std::make_shared<std::pair<PendingComm, PendingComm>>(std::move(notice), std::move(sent));
  return PendingComm(
      [parts] {
        parts->first.wait();
        parts->second.wait();
      },
      message);
}

BundleReceive::BundleReceive(Transport& transport, int peer, int tag, std::string what,
                             MessageLengths& lengths)
    : transport_(&transport), peer_(peer), tag_(tag), what_(std::move(what)), lengths_(&lengths) {
  const int64_t expected = lengths.received.try_emplace(tag, kNoticeBytes).first->second;
  first_ = transport.recv(torch::empty({expected}, torch::kUInt8), peer, tag);
}

TensorBundle BundleReceive::finish() {
  PPTRAIN_ASSERT(transport_ != nullptr, "finish() of a receive never posted");
  first_.wait();
  torch::Tensor message = first_.tensor();
  const int64_t length = announced_length(message, what_);
  if (length != message.numel()) {  // a notice: the message follows at its new length
    PendingComm rest = transport_->recv(torch::empty({length}, torch::kUInt8), peer_, tag_);
    rest.wait();
    message = rest.tensor();
    PPTRAIN_CHECK(announced_length(message, what_) == length, what_,
                  ": a message of another length than its notice said");
  }
  lengths_->received[tag_] = length;
  return unpack(message, what_);
}

}  // namespace pptrain
