// Validation of `megatune train`'s numeric flags and checkpoint paths.
#include "tools/train_option_checks.h"

#include <cmath>
#include <sstream>

#include "base/user_error.h"
#include "executor/checkpoint/run_lineage.h"

namespace megatune::tools {
namespace {

std::string text_of(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

void require(bool ok, const std::string& flag, double value, const std::string& need) {
  if (!ok) throw UserError(flag + " " + text_of(value) + " makes no sense: give " + need);
}

void finite_at_least_zero(const std::string& flag, double value, const std::string& example) {
  require(std::isfinite(value) && value >= 0, flag, value, "a finite number >= 0, e.g. " + example);
}

void finite_positive(const std::string& flag, double value, const std::string& example) {
  require(std::isfinite(value) && value > 0, flag, value, "a finite number > 0, e.g. " + example);
}

}  // namespace

void validate_train_options(const executor::TrainOptions& o) {
  finite_at_least_zero("--lr", o.lr, "1e-4");
  finite_at_least_zero("--min-lr", o.min_lr, "1e-5");
  finite_at_least_zero("--lr-warmup-init", o.lr_warmup_init, "0");
  if (o.min_lr > o.lr) {
    throw UserError("--min-lr " + text_of(o.min_lr) + " exceeds --lr " + text_of(o.lr) +
                    ": give a floor at most the peak learning rate");
  }
  if (o.decoupled_lr) finite_at_least_zero("--decoupled-lr", *o.decoupled_lr, "2e-4");
  if (o.decoupled_min_lr) finite_at_least_zero("--decoupled-min-lr", *o.decoupled_min_lr, "2e-5");
  if (o.decoupled_lr && o.decoupled_min_lr && *o.decoupled_min_lr > *o.decoupled_lr) {
    throw UserError("--decoupled-min-lr " + text_of(*o.decoupled_min_lr) + " exceeds --decoupled-lr " +
                    text_of(*o.decoupled_lr) + ": give a floor at most the decoupled peak learning rate");
  }
  if (o.lr_warmup_fraction) {
    require(std::isfinite(*o.lr_warmup_fraction) && *o.lr_warmup_fraction >= 0 && *o.lr_warmup_fraction <= 1,
            "--lr-warmup-fraction", *o.lr_warmup_fraction, "a fraction in [0, 1], e.g. 0.01");
  }
  if (o.lr_warmup_iters && *o.lr_warmup_iters < 0)
    throw UserError("--lr-warmup-iters " + std::to_string(*o.lr_warmup_iters) + " must be >= 0");
  if (o.lr_decay_iters && *o.lr_decay_iters < 1)
    throw UserError("--lr-decay-iters " + std::to_string(*o.lr_decay_iters) + " must be >= 1");
  if (o.lr_wsd_decay_iters && *o.lr_wsd_decay_iters < 0)
    throw UserError("--lr-wsd-decay-iters " + std::to_string(*o.lr_wsd_decay_iters) + " must be >= 0");
  finite_at_least_zero("--weight-decay", o.weight_decay, "0.1");
  finite_at_least_zero("--clip-grad", o.clip_grad, "1.0 (0 turns clipping off)");
  require(std::isfinite(o.adam_beta1) && o.adam_beta1 >= 0 && o.adam_beta1 < 1, "--adam-beta1", o.adam_beta1,
          "a number in [0, 1), e.g. 0.9");
  require(std::isfinite(o.adam_beta2) && o.adam_beta2 >= 0 && o.adam_beta2 < 1, "--adam-beta2", o.adam_beta2,
          "a number in [0, 1), e.g. 0.95");
  finite_positive("--adam-eps", o.adam_eps, "1e-8");
  finite_positive("--init-method-std", o.init_method_std, "0.02");
  finite_positive("--norm-epsilon", o.norm_epsilon, "1e-5");
  finite_positive("--rotary-base", o.rotary_base, "10000");
  finite_positive("--distributed-timeout-minutes", o.distributed_timeout_minutes, "10");
  if (o.train_iters < 1) throw UserError("--train-iters " + std::to_string(o.train_iters) + " must be >= 1");
  if (o.log_interval < 1)
    throw UserError("--log-interval " + std::to_string(o.log_interval) + " must be >= 1");
  if (o.save_interval < 0) {
    throw UserError("--save-interval " + std::to_string(o.save_interval) +
                    " must be >= 0 (0: save at the end only)");
  }
  if (o.save_interval > 0 && o.save.empty())
    throw UserError("--save-interval " + std::to_string(o.save_interval) + " needs --save DIR to save into");
}

std::string check_load_path(const std::string& load) {
  if (load.empty()) return "";
  if (executor::checkpoint::inspect_load_directory(load) == executor::checkpoint::LoadState::kCheckpoint)
    return "";
  return "--load " + load + " holds no checkpoint yet: starting a new run from iteration 0";
}

}  // namespace megatune::tools
