#include "pptrain/train/pipemare.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/train/stage_hooks.h"

namespace pptrain {

PipeMareOptions pipemare_options(const FamilyValues& given) {
  PipeMareOptions out;
  out.lr_reschedule = !family_switch(given, "--no-lr-reschedule");
  out.correction = !family_switch(given, "--no-discrepancy-correction");
  out.warmup_steps = family_int(given, "--pipemare-warmup", out.warmup_steps);
  out.decay = family_number(given, "--pipemare-decay", out.decay);
  return out;
}

double pipemare_lr_scale(int delay, int step, int warmup_steps) {
  if (delay <= 1) return 1;
  const double progress =
      warmup_steps > 0 ? std::min(static_cast<double>(step) / warmup_steps, 1.0) : 1.0;
  return std::pow(static_cast<double>(delay), -(1 - progress));
}

PipeMareStage::PipeMareStage(Stage* live, std::function<Stage()> make_copy, int delay,
                             const PipeMareOptions& options)
    : live_(live), delay_(delay), options_(options), corrected_(std::move(make_copy)) {
  if (!corrects()) return;
  keep_ = std::pow(options_.decay, 1.0 / delay_);
  for (const auto& p : live_->parameters()) delta_.push_back(torch::zeros_like(p));
}

double PipeMareStage::lr_scale(int step) const {
  return options_.lr_reschedule ? pipemare_lr_scale(delay_, step, options_.warmup_steps) : 1.0;
}

Stage& PipeMareStage::backward_weights(Stage& newest, int lag) {
  PPTRAIN_ASSERT(!corrected_pending_, "stage ", live_->index(),
                 ": a corrected backward's gradients were not collected");
  if (!corrects() || lag == 0) return newest;
  corrected_pending_ = true;
  return corrected_.shift(newest, delta_, static_cast<double>(lag));
}

void PipeMareStage::gradients_to(Stage& newest) {
  if (!corrected_pending_) return;
  corrected_pending_ = false;
  corrected_.gradients_to(newest);
}

// delta <- g * delta + (1 - g) * (w_new - w_old), in two halves so no copy of w_old is kept.
void PipeMareStage::before_step() {
  if (!corrects()) return;
  torch::NoGradGuard no_grad;
  const auto params = live_->parameters();
  for (size_t p = 0; p < params.size(); ++p) {
    delta_[p].mul_(keep_).sub_(params[p], 1 - keep_);
  }
}

void PipeMareStage::after_step() {
  if (!corrects()) return;
  torch::NoGradGuard no_grad;
  const auto params = live_->parameters();
  for (size_t p = 0; p < params.size(); ++p) delta_[p].add_(params[p], 1 - keep_);
}

void PipeMareStage::save_state(const std::string& prefix, NamedTensors& out) const {
  PPTRAIN_ASSERT(!corrected_pending_, "stage ", live_->index(), ": a checkpoint inside a backward");
  put_tensors(prefix + "pipemare_delta/", delta_, out);
}

void PipeMareStage::load_state(const std::string& prefix, const NamedTensors& in,
                               const std::string& flag) {
  const auto values = take_tensors(prefix + "pipemare_delta/", in, flag);
  PPTRAIN_CHECK(values.size() == delta_.size(), flag, ": the state in flight has ", values.size(),
                " pipemare averages for stage ", live_->index(), ", which has ", delta_.size());
  for (size_t p = 0; p < values.size(); ++p) {
    PPTRAIN_CHECK(values[p].sizes() == delta_[p].sizes(), flag,
                  ": a pipemare average in the state in flight has another shape than stage ",
                  live_->index(), "'s parameter");
    delta_[p].copy_(values[p]);
  }
}

namespace {

// The fixes as the updates' hooks: a backward runs on the corrected weights of its version.
class DelayCorrection final : public StageHooks {
 public:
  DelayCorrection(const VersionRule& rule, Stage* live, std::function<Stage()> make_copy,
                  const FamilyValues& family)
      : rule_(rule),
        stage_(live->index()),
        fixes_(live, std::move(make_copy), rule.delay(live->index()), pipemare_options(family)) {}

  Stage& weights(int mb, bool backward, StageVersions& versions) override {
    const int version =
        backward ? rule_.backward_version(mb, stage_) : rule_.forward_version(mb, stage_);
    Stage& newest = versions.weights(version);
    if (!backward) return newest;
    return fixes_.backward_weights(newest, version - rule_.forward_version(mb, stage_));
  }
  void gradients_to(Stage& target) override { fixes_.gradients_to(target); }
  double lr_scale(int step) const override { return fixes_.lr_scale(step); }
  void before_step() override { fixes_.before_step(); }
  void after_update(const StageUpdate& update) override {
    if (update.stepped) fixes_.after_step();
  }
  int buffers() const override { return fixes_.buffers(); }
  void save_state(const std::string& prefix, NamedTensors& out) const override {
    fixes_.save_state(prefix, out);
  }
  void load_state(const std::string& prefix, const NamedTensors& in,
                  const std::string& flag) override {
    fixes_.load_state(prefix, in, flag);
  }

 private:
  VersionRule rule_;
  int stage_;
  PipeMareStage fixes_;
};

}  // namespace

std::unique_ptr<StageHooks> make_delay_correction(const VersionRule& rule, Stage* live,
                                                  const std::function<Stage()>& make_copy,
                                                  const FamilyValues& family) {
  return std::make_unique<DelayCorrection>(rule, live, make_copy, family);
}

}  // namespace pptrain
