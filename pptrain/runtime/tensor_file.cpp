#include "pptrain/runtime/tensor_file.h"

#include <filesystem>

#include "pptrain/common/check.h"

namespace pptrain {

NamedTensors read_tensor_file(const std::string& path, const std::string& flag) {
  PPTRAIN_CHECK(std::filesystem::is_regular_file(path), flag, ": missing file '", path, "'");
  NamedTensors out;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    for (const std::string& name : archive.keys()) {
      torch::Tensor tensor;
      archive.read(name, tensor);
      out.emplace(name, tensor);
    }
  } catch (const c10::Error&) {
    PPTRAIN_CHECK(false, flag, ": '", path, "' is not a file of tensors pptrain wrote");
  }
  return out;
}

const torch::Tensor& tensor_named(const NamedTensors& tensors, const std::string& name,
                                  const std::string& flag) {
  const auto found = tensors.find(name);
  PPTRAIN_CHECK(found != tensors.end(), flag, ": the checkpoint's state in flight has no '", name,
                "'");
  return found->second;
}

torch::Tensor number_tensor(int64_t value) {
  return torch::tensor({value}, torch::kInt64);
}

int64_t number_of(const NamedTensors& tensors, const std::string& name, const std::string& flag) {
  const torch::Tensor& t = tensor_named(tensors, name, flag);
  PPTRAIN_CHECK(t.numel() == 1 && t.scalar_type() == torch::kInt64, flag, ": '", name,
                "' in the checkpoint's state in flight is not a whole number");
  return t.item<int64_t>();
}

void put_tensors(const std::string& prefix, const std::vector<torch::Tensor>& tensors,
                 NamedTensors& out) {
  out[prefix + "count"] = number_tensor(static_cast<int64_t>(tensors.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    out[prefix + std::to_string(i)] = tensors[i].detach();
  }
}

std::vector<torch::Tensor> take_tensors(const std::string& prefix, const NamedTensors& in,
                                        const std::string& flag) {
  const int64_t count = number_of(in, prefix + "count", flag);
  std::vector<torch::Tensor> out;
  for (int64_t i = 0; i < count; ++i) {
    out.push_back(tensor_named(in, prefix + std::to_string(i), flag).clone());
  }
  return out;
}

namespace {

// `values` into `into`, in place; UserError when the count or a shape differs.
void copy_into(const std::vector<torch::Tensor>& values, const std::vector<torch::Tensor>& into,
               const std::string& what, const std::string& flag) {
  PPTRAIN_CHECK(values.size() == into.size(), flag, ": the state in flight has ", values.size(),
                " tensors for ", what, ", which has ", into.size());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < values.size(); ++i) {
    PPTRAIN_CHECK(values[i].sizes() == into[i].sizes(), flag, ": tensor ", i, " of ", what,
                  " in the state in flight has another shape than the model's");
    into[i].copy_(values[i]);
  }
}

std::vector<torch::Tensor> gradients_of(const Stage& stage) {
  std::vector<torch::Tensor> out;
  for (const auto& p : stage.parameters()) {
    out.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  }
  return out;
}

}  // namespace

void put_weights(const std::string& prefix, const Stage& stage, NamedTensors& out) {
  put_tensors(prefix + "param/", stage.parameters(), out);
  put_gradients(prefix, stage, out);
}

void take_weights(const std::string& prefix, const NamedTensors& in, Stage& stage,
                  const std::string& flag) {
  copy_into(take_tensors(prefix + "param/", in, flag), stage.parameters(),
            "the weights of stage " + std::to_string(stage.index()), flag);
  take_gradients(prefix, in, stage, flag);
}

void put_gradients(const std::string& prefix, const Stage& stage, NamedTensors& out) {
  put_tensors(prefix + "grad/", gradients_of(stage), out);
}

void take_gradients(const std::string& prefix, const NamedTensors& in, Stage& stage,
                    const std::string& flag) {
  const auto values = take_tensors(prefix + "grad/", in, flag);
  auto params = stage.parameters();
  for (auto& p : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
  copy_into(values, gradients_of(stage), "the gradients of stage " + std::to_string(stage.index()),
            flag);
}

// Keys "<prefix>/<i>" or "<prefix>/<i>:<name>"; an undefined tensor as "<key>/undefined".
void put_bundle(const std::string& prefix, const TensorBundle& bundle, NamedTensors& out) {
  for (size_t i = 0; i < bundle.size(); ++i) {
    std::string key = prefix + "/" + std::to_string(i);
    if (bundle.named()) key += ":" + bundle.names()[i];
    if (bundle[i].defined()) {
      out[key] = bundle[i].detach();
    } else {
      out[key + "/undefined"] = number_tensor(0);
    }
  }
}

TensorBundle take_bundle(const std::string& prefix, const NamedTensors& in) {
  std::map<int, std::pair<std::string, torch::Tensor>> parts;  // index -> name, tensor
  const std::string start = prefix + "/";
  for (auto it = in.lower_bound(start); it != in.end() && it->first.rfind(start, 0) == 0; ++it) {
    std::string rest = it->first.substr(start.size());
    const bool undefined =
        rest.size() > 10 && rest.compare(rest.size() - 10, 10, "/undefined") == 0;
    if (undefined) rest.resize(rest.size() - 10);
    const size_t colon = rest.find(':');
    const std::string index = rest.substr(0, colon);
    if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) continue;
    parts[std::stoi(index)] = {colon == std::string::npos ? "" : rest.substr(colon + 1),
                               undefined ? torch::Tensor() : it->second};
  }
  TensorBundle out;
  for (auto& [index, part] : parts) {
    PPTRAIN_CHECK(index == static_cast<int>(out.size()), "the tensors under '", prefix,
                  "' skip number ", out.size());
    if (part.first.empty()) {
      out.push_back(part.second);
    } else {
      out.add(part.first, part.second);
    }
  }
  return out;
}

}  // namespace pptrain
