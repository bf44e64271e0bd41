#include "models/gpt.h"

#include <initializer_list>
#include <map>
#include <string>
#include <utility>

#include "ATen/ATen.h"
#include "base/collectives.h"
#include "base/named_parameters.h"
#include "c10/util/Exception.h"
#include "models/tied_head.h"
#include "parallel/moe/router.h"
#include "parallel/moe/token_dispatcher.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/mappings.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::models {
namespace {

// The word embedding, which the first and the last stage each hold (the tie).
constexpr char kWordEmbedding[] = "wte";

torch::nn::LayerNorm Norm(int64_t hidden_size) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden_size}));
}

// The parameters of the LayerNorms `names` (with sequence parallelism: they see this rank's
// share of the sequence).
std::vector<std::string> NormParameters(std::initializer_list<const char*> names) {
  std::vector<std::string> parameters;
  for (const char* name : names) {
    parameters.push_back(std::string(name) + ".weight");
    parameters.push_back(std::string(name) + ".bias");
  }
  return parameters;
}

class BlockImpl : public torch::nn::Module, public parallel::SequenceSplit {
 public:
  // A block whose MLP is a mixture of experts over `groups.ep` and `groups.expert_tp` if `moe`;
  // `moe_stats` (the model's) gathers its routing statistics and gives the load-balancing
  // loss's gradient weight. `sequence_parallel`: the model's.
  BlockImpl(const ModelOptions& options, const ModelGroups& groups, bool sequence_parallel,
            bool moe, MoeStats* moe_stats)
      : ln_1_(register_module("ln_1", Norm(options.hidden_size))),
        attn_(register_module(
            "attn",
            parallel::ParallelSelfAttention(
                options.hidden_size, options.num_attention_heads, groups.tp, sequence_parallel,
                parallel::RecomputesModule(options.recompute, parallel::kCoreAttn)))),
        ln_2_(register_module("ln_2", Norm(options.hidden_size))),
        sequence_parallel_(sequence_parallel),
        tp_(groups.tp),
        ep_(groups.ep),
        moe_stats_(moe_stats),
        recompute_mlp_(parallel::RecomputesModule(options.recompute, parallel::kMlp)),
        recompute_norms_(parallel::RecomputesModule(options.recompute, parallel::kLayernorm)) {
    c10d::ProcessGroup* tp = groups.tp;
    if (!moe) {
      fc_ = register_module("fc", parallel::ColumnParallelLinear(
                                      options.hidden_size, options.ffn_hidden_size, tp,
                                      /*bias=*/true, /*gather_output=*/false, sequence_parallel));
      mlp_proj_ = register_module(
          "mlp_proj", parallel::RowParallelLinear(options.ffn_hidden_size, options.hidden_size, tp,
                                                  /*bias=*/true, /*input_is_parallel=*/true,
                                                  sequence_parallel));
      return;
    }
    parallel::RouterOptions router;
    router.num_moe_experts = options.num_moe_experts;
    router.moe_router_topk = options.moe_router_topk;
    router.moe_aux_loss_coeff = options.moe_aux_loss_coeff;
    router.moe_router_pre_softmax = options.moe_router_pre_softmax;
    router_ = register_module("router", parallel::TopKRouter(options.hidden_size, router));
    experts_ = register_module(
        "experts", parallel::SequentialMlp(options.num_moe_experts, options.hidden_size,
                                           options.ffn_hidden_size, groups.ep, groups.expert_tp));
  }

  at::Tensor forward(const at::Tensor& x, const base::PackedSequences* packed) {
    const at::Tensor h = x + attn_->forward(Normed(ln_1_, x), packed);
    return h + parallel::RecomputeIf(
                   recompute_mlp_, [this](const std::vector<at::Tensor>& y) { return Mlp(y[0]); },
                   {Normed(ln_2_, h)}, MlpParameters());
  }

  std::vector<std::string> LocalSequenceParallelParameters() const override {
    if (!sequence_parallel_) return {};
    return NormParameters({"ln_1", "ln_2"});
  }

 private:
  // norm(x), recomputed in backward when "selective" lists the norms.
  at::Tensor Normed(const torch::nn::LayerNorm& norm, const at::Tensor& x) const {
    return parallel::RecomputeIf(
        recompute_norms_,
        [norm = norm.ptr()](const std::vector<at::Tensor>& in) { return norm->forward(in[0]); },
        {x}, norm->parameters());
  }

  // The parameters Mlp reads: the dense MLP's, or the router's and the experts'.
  std::vector<at::Tensor> MlpParameters() const {
    if (!recompute_mlp_) return {};
    const std::vector<std::shared_ptr<torch::nn::Module>> parts =
        router_.is_empty()
            ? std::vector<std::shared_ptr<torch::nn::Module>>{fc_.ptr(), mlp_proj_.ptr()}
            : std::vector<std::shared_ptr<torch::nn::Module>>{router_.ptr(), experts_.ptr()};
    std::vector<at::Tensor> parameters;
    for (const auto& part : parts) {
      for (const at::Tensor& p : part->parameters()) parameters.push_back(p);
    }
    return parameters;
  }

  at::Tensor Mlp(const at::Tensor& y) {
    if (router_.is_empty()) return mlp_proj_->forward(at::gelu(fc_->forward(y)));
    // With sequence parallelism the experts take the whole sequence, routed as without it; the
    // gradient of the gathered tokens is whole on every rank (the sums over expert_tp are made
    // inside), so backward keeps this rank's chunk of it.
    const at::Tensor whole = sequence_parallel_ ? parallel::GatherFromSequenceParallelRegion(
                                                      y, tp_, /*tensor_parallel_output_grad=*/false)
                                                : y;
    const at::Tensor tokens = whole.reshape({-1, whole.size(-1)});
    const parallel::Routing routing = router_->forward(tokens);
    at::Tensor parts = parallel::DispatchToExperts(tokens, routing, *experts_, ep_);
    if (at::GradMode::is_enabled()) {  // training, not validation
      moe_stats_->Add(routing.aux_loss.detach(), routing.tokens_per_expert);
      if (router_->options().moe_aux_loss_coeff != 0.0) {
        parts = parallel::AttachAuxLoss(parts, routing.aux_loss, moe_stats_->aux_loss_scale);
      }
    }
    return parallel::SumExpertParts(parts.view_as(whole), *experts_,
                                    sequence_parallel_ ? tp_ : nullptr);
  }

  torch::nn::LayerNorm ln_1_;
  parallel::ParallelSelfAttention attn_;
  torch::nn::LayerNorm ln_2_;
  bool sequence_parallel_;
  c10d::ProcessGroup* tp_;
  parallel::ColumnParallelLinear fc_{nullptr};
  parallel::RowParallelLinear mlp_proj_{nullptr};
  parallel::TopKRouter router_{nullptr};
  parallel::SequentialMlp experts_{nullptr};
  c10d::ProcessGroup* ep_;
  MoeStats* moe_stats_;
  bool recompute_mlp_, recompute_norms_;
};

TORCH_MODULE(Block);

// GPT-2's initialisation of the one-rank model `one_rank`, in named_parameters() order (the
// tied head once, as the word embedding): N(0, 0.02) for embeddings and projection weights,
// zero biases; LayerNorms keep their ones and zeros.
std::vector<parallel::WholeInitStep> InitLikeGpt2(const torch::nn::Module& one_rank) {
  std::vector<parallel::WholeInitStep> steps;
  for (const auto& [name, parameter] : base::UniqueNamedParameters(one_rank).unique) {
    if (name.find("ln_") != std::string::npos) continue;
    steps.push_back({name, parameter.sizes().vec(), parameter.scalar_type(),
                     name.find(".bias") != std::string::npos ? 0.0 : 0.02});
  }
  return steps;
}

}  // namespace

StageParameters CountGptStageParameters(const ModelOptions& options,
                                        const parallel::ModelParallelOptions& parallel,
                                        int64_t stage) {
  const int64_t tp = parallel.tensor_model_parallel_size;
  const int64_t pp = parallel.pipeline_model_parallel_size;
  const int64_t ep = parallel.expert_model_parallel_size;
  const int64_t expert_tp = parallel.expert_tensor_parallel_size.value_or(tp);
  const int64_t h = options.hidden_size, ffn = options.ffn_hidden_size;
  const parallel::StageLayers layers = StageLayersOf(options.num_layers, pp, stage);
  StageParameters count;
  const bool first = stage == 0, last = stage == pp - 1;
  if (first || last) count.dense += PaddedVocabSize(options, tp) / tp * h;  // wte (and the head)
  if (first) count.dense += options.max_sequence_length * h;                // wpe
  if (last) count.dense += 2 * h;                                           // ln_f
  // Layer i is a mixture of experts when i % moe_layer_freq == 0: multiples of the frequency
  // below the stage's end less those below its first layer.
  const int64_t freq = options.moe_layer_freq;
  const auto multiples_below = [freq](int64_t n) { return (n + freq - 1) / freq; };
  const int64_t moe = options.num_moe_experts > 0 ? multiples_below(layers.first + layers.count) -
                                                        multiples_below(layers.first)
                                                  : 0;
  // ln_1, ln_2; qkv (column-parallel) and proj (row-parallel), with biases.
  count.dense += layers.count * (4 * h + (3 * h / tp) * (h + 1) + h * (h / tp) + h);
  count.dense += moe * options.num_moe_experts * h;  // the routers
  count.experts += moe * (options.num_moe_experts / ep * 2 * h * (ffn / expert_tp));
  count.dense += (layers.count - moe) * ((ffn / tp) * (h + 1) + h * (ffn / tp) + h);  // fc, proj
  return count;
}

GptImpl::GptImpl(const ModelOptions& options, const ModelGroups& groups)
    : GptImpl(options, groups, PaddedVocabSize(options, base::GroupSize(groups.tp)),
              StageLayersOf(options.num_layers, groups.pp), base::GroupRank(groups.pp) == 0,
              base::GroupRank(groups.pp) == base::GroupSize(groups.pp) - 1) {
  // The layers allocate and draw nothing: the generator's draws are GPT-2's initialisation
  // alone, the same at every tensor-, pipeline- and expert-parallel size.
  const bool whole = !pipelined_ && base::GroupSize(groups.tp) == 1 &&
                     base::GroupSize(groups.ep) == 1 && base::GroupSize(groups.expert_tp) == 1;
  InitialiseAsOneRankModel(*this, whole, InitLikeGpt2, [&] {
    return std::unique_ptr<torch::nn::Module>(
        new GptImpl(options, ModelGroups{}, PaddedVocabSize(options, base::GroupSize(groups.tp)),
                    {0, options.num_layers}, true, true));
  });
}

GptImpl::GptImpl(const ModelOptions& options, const ModelGroups& groups, int64_t padded_vocab_size,
                 parallel::StageLayers layers, bool first, bool last)
    : LanguageModel(groups),
      tp_(groups.tp),
      hidden_size_(options.hidden_size),
      pipelined_(!(first && last)),
      recompute_(options.recompute),
      cross_entropy_chunk_len_(CrossEntropyChunkLen(options)) {
  c10d::ProcessGroup* tp = groups.tp;
  // The last stage holds its own copy of the word embedding for the tied head.
  if (first || last) {
    wte_ = register_module(kWordEmbedding, parallel::VocabParallelEmbedding(
                                               padded_vocab_size, options.hidden_size, tp));
  }
  if (first) {
    // The positions are not split: an embedding with no group.
    wpe_ = register_module("wpe", parallel::VocabParallelEmbedding(options.max_sequence_length,
                                                                   options.hidden_size, nullptr));
  }
  auto blocks = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int64_t i = layers.first; i < layers.first + layers.count; ++i) {
    const bool moe = options.num_moe_experts > 0 && i % options.moe_layer_freq == 0;
    blocks_.push_back(blocks->register_module(
        std::to_string(i), Block(options, groups, sequence_parallel(), moe, &moe_stats())));
  }
  if (last) ln_f_ = register_module("ln_f", Norm(options.hidden_size));
  if (last) register_module("lm_head", TiedHead(wte_));
}

at::Tensor GptImpl::StageForward(const at::Tensor& tokens, const at::Tensor& input,
                                 const base::PackedSequences* packed) {
  const int64_t seq = tokens.size(1);
  at::Tensor x = input;
  if (first_stage()) {
    const at::Tensor positions = packed != nullptr
                                     ? packed->position_ids
                                     : at::arange(seq, tokens.options().dtype(at::kLong));
    x = wte_->forward(tokens) + wpe_->forward(positions);
    // Megatron's learned positions: added whole, then this rank's share of the sequence kept.
    if (sequence_parallel()) x = parallel::ScatterToSequenceParallelRegion(x, tp_);
  }
  // Captured by value: a recomputed block runs again in the backward pass.
  x = parallel::RunLayers(
      static_cast<int64_t>(blocks_.size()), recompute_, is_training(),
      [blocks = blocks_, packed](int64_t i, const at::Tensor& h) {
        return blocks[i]->as<BlockImpl>()->forward(h, packed);
      },
      [this](int64_t i) { return blocks_[i]->parameters(); }, x);
  return x;
}

at::Tensor GptImpl::HeadInput(const at::Tensor& hidden) {
  return parallel::ColumnParallelInput(ln_f_->forward(hidden), tp_, sequence_parallel());
}

at::Tensor GptImpl::Logits(const at::Tensor& hidden) {
  // A column-parallel lm_head: the hidden states go whole to every rank's vocabulary slice
  // (with sequence parallelism, gathered).
  return parallel::ColumnParallelProduct(ln_f_->forward(hidden), wte_->weight(), at::Tensor(), tp_,
                                         sequence_parallel());
}

at::Tensor GptImpl::HeadLosses(const at::Tensor& hidden, const at::Tensor& labels) {
  return parallel::LinearCrossEntropy(HeadInput(hidden), wte_->weight(), labels, tp_,
                                      {cross_entropy_chunk_len_, std::nullopt});
}

std::vector<std::string> GptImpl::LocalSequenceParallelParameters() const {
  if (!sequence_parallel() || !last_stage()) return {};
  return NormParameters({"ln_f"});
}

std::vector<std::string> GptImpl::VocabParameters() const {
  std::vector<std::string> names;
  if (!wte_.is_empty()) names.push_back(std::string(kWordEmbedding) + ".weight");
  if (last_stage()) names.push_back("lm_head.weight");
  return names;
}

std::optional<std::string> GptImpl::SharedEmbedding() const {
  if (!pipelined_) return std::nullopt;
  return std::string(kWordEmbedding) + ".weight";
}

}  // namespace keel::models
