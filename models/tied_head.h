// An output layer tied to the word embedding: a module whose "weight" is the embedding's
// weight itself (a tie, not a copy) with the embedding's layout, so that the tied name
// ("lm_head.weight") appears where checkpoints and Hugging Face files expect it.
#ifndef KEEL_MODELS_TIED_HEAD_H_
#define KEEL_MODELS_TIED_HEAD_H_

#include <map>
#include <string>
#include <utility>

#include "parallel/layout.h"
#include "parallel/tensor_parallel/layers.h"
#include "torch/nn/module.h"
#include "torch/nn/pimpl.h"

namespace keel::models {

class TiedHeadImpl : public torch::nn::Module, public parallel::LaidOut {
 public:
  explicit TiedHeadImpl(parallel::VocabParallelEmbedding tied) : tied_(std::move(tied)) {
    register_parameter("weight", tied_->weight());
  }
  std::map<std::string, parallel::TensorLayout> LocalLayouts() const override {
    return tied_->LocalLayouts();
  }

 private:
  parallel::VocabParallelEmbedding tied_;
};
TORCH_MODULE(TiedHead);

}  // namespace keel::models

#endif  // KEEL_MODELS_TIED_HEAD_H_
