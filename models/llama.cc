#include "models/llama.h"

#include <string>
#include <utility>

#include "ATen/ATen.h"
#include "base/collectives.h"
#include "c10/util/Exception.h"
#include "models/attention.h"
#include "models/gated_mlp.h"
#include "models/hf_config.h"
#include "models/tied_head.h"
#include "parallel/parameters.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/mappings.h"

namespace keel::models {
namespace {

// The modules holding the word embedding (kHfEmbeddingWeight), which the first and (tied) the
// last stage hold.
constexpr char kBody[] = "model";
constexpr char kEmbedding[] = "embed_tokens";

AttentionOptions AttentionOf(const ModelOptions& options) {
  AttentionOptions attention;
  attention.hidden_size = options.hidden_size;
  attention.num_heads = options.num_attention_heads;
  attention.num_kv_heads = KvHeads(options);
  attention.head_dim = HeadDim(options);
  attention.qkv_bias = options.family == ModelFamily::kQwen2;
  attention.qk_norm = options.family == ModelFamily::kQwen3;
  attention.norm_eps = options.norm_epsilon;
  attention.window = options.window_size;
  attention.recompute_core_attn =
      parallel::RecomputesModule(options.recompute, parallel::kCoreAttn);
  return attention;
}

RopeOptions RopeOf(const ModelOptions& options) {
  RopeOptions rope;
  rope.theta = options.rotary_base;
  rope.scaling_factor = options.rope_scaling_factor;
  rope.low_freq_factor = options.rope_low_freq_factor;
  rope.high_freq_factor = options.rope_high_freq_factor;
  rope.original_max_position_embeddings = options.rope_original_max_position_embeddings;
  return rope;
}

// One decoder layer: h += attention(input_layernorm(h)); h += mlp(post_attention_layernorm(h)).
class DecoderLayerImpl : public torch::nn::Module, public parallel::SequenceSplit {
 public:
  // `sequence_parallel`: the model's.
  DecoderLayerImpl(const ModelOptions& options, c10d::ProcessGroup* tp, bool sequence_parallel)
      : input_layernorm_(
            register_module("input_layernorm", RmsNorm(options.hidden_size, options.norm_epsilon))),
        self_attn_(
            register_module("self_attn", Attention(AttentionOf(options), tp, sequence_parallel))),
        post_attention_layernorm_(register_module(
            "post_attention_layernorm", RmsNorm(options.hidden_size, options.norm_epsilon))),
        mlp_(register_module(
            "mlp", GatedMlp(options.hidden_size, options.ffn_hidden_size, tp, sequence_parallel))),
        sequence_parallel_(sequence_parallel),
        recompute_mlp_(parallel::RecomputesModule(options.recompute, parallel::kMlp)),
        recompute_norms_(parallel::RecomputesModule(options.recompute, parallel::kLayernorm)) {}

  std::vector<std::string> LocalSequenceParallelParameters() const override {
    if (!sequence_parallel_) return {};
    return {"input_layernorm.weight", "post_attention_layernorm.weight"};
  }

  at::Tensor forward(const at::Tensor& x, const RotaryTables& tables,
                     const base::PackedSequences* packed) {
    const at::Tensor h = x + self_attn_->forward(Normed(input_layernorm_, x), tables, packed);
    return h +
           parallel::RecomputeIf(
               recompute_mlp_,
               [mlp = mlp_.ptr()](const std::vector<at::Tensor>& y) { return mlp->forward(y[0]); },
               {Normed(post_attention_layernorm_, h)}, mlp_->parameters());
  }

 private:
  // norm(x), recomputed in backward when "selective" lists the norms.
  at::Tensor Normed(const RmsNorm& norm, const at::Tensor& x) const {
    return parallel::RecomputeIf(
        recompute_norms_,
        [norm = norm.ptr()](const std::vector<at::Tensor>& in) { return norm->forward(in[0]); },
        {x}, norm->parameters());
  }

  RmsNorm input_layernorm_;
  Attention self_attn_;
  RmsNorm post_attention_layernorm_;
  GatedMlp mlp_;
  bool sequence_parallel_;
  bool recompute_mlp_, recompute_norms_;
};
TORCH_MODULE(DecoderLayer);

// HF's initialisation (initializer_range 0.02) of the one-rank model `one_rank`, module by
// module in registration order: the embedding and every linear layer's weight N(0, 0.02),
// biases zero; RMSNorms keep their ones.
std::vector<parallel::WholeInitStep> InitLikeHf(const torch::nn::Module& one_rank) {
  std::vector<parallel::WholeInitStep> steps;
  for (const auto& item : one_rank.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const torch::nn::Module& module = *item.value();
    const bool drawn =
        dynamic_cast<const parallel::ColumnParallelLinearImpl*>(&module) != nullptr ||
        dynamic_cast<const parallel::RowParallelLinearImpl*>(&module) != nullptr ||
        dynamic_cast<const parallel::VocabParallelEmbeddingImpl*>(&module) != nullptr;
    if (!drawn) continue;
    for (const auto& parameter : module.named_parameters(/*recurse=*/false)) {
      steps.push_back({item.key() + "." + parameter.key(), parameter.value().sizes().vec(),
                       parameter.value().scalar_type(), parameter.key() == "weight" ? 0.02 : 0.0});
    }
  }
  return steps;
}

}  // namespace

StageParameters CountLlamaStageParameters(const ModelOptions& options,
                                          const parallel::ModelParallelOptions& parallel,
                                          int64_t stage) {
  const int64_t tp = parallel.tensor_model_parallel_size;
  const int64_t pp = parallel.pipeline_model_parallel_size;
  const int64_t h = options.hidden_size, d = HeadDim(options);
  const int64_t q = options.num_attention_heads * d / tp, kv = KvHeads(options) * d / tp;
  const parallel::StageLayers layers = StageLayersOf(options.num_layers, pp, stage);
  StageParameters count;
  const bool first = stage == 0, last = stage == pp - 1;
  const int64_t vocab_rows = PaddedVocabSize(options, tp) / tp * h;
  const bool tied = !options.untie_embeddings_and_output_weights;
  if (first || (last && tied)) count.dense += vocab_rows;  // embed_tokens
  if (last) count.dense += h + (tied ? 0 : vocab_rows);    // norm, lm_head
  const bool qkv_bias = options.family == ModelFamily::kQwen2;
  const bool qk_norm = options.family == ModelFamily::kQwen3;
  count.dense += layers.count * (2 * h                       // the two norms
                                 + (q + 2 * kv) * h + h * q  // q, k, v, o
                                 + (qkv_bias ? q + 2 * kv : 0) + (qk_norm ? 2 * d : 0) +
                                 3 * h * (options.ffn_hidden_size / tp));  // gate, up, down
  return count;
}

std::map<std::string, std::vector<int64_t>> LlamaLayerShapes(const ModelOptions& options) {
  ModelOptions one_layer = options;
  one_layer.num_layers = 1;
  const parallel::MetaParameters meta;
  const LlamaImpl model(one_layer, ModelGroups{}, PaddedVocabSize(one_layer, 1), {0, 1},
                        /*first=*/true, /*last=*/true);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : model.named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  return shapes;
}

LlamaImpl::LlamaImpl(const ModelOptions& options, const ModelGroups& groups)
    : LlamaImpl(options, groups, PaddedVocabSize(options, base::GroupSize(groups.tp)),
                StageLayersOf(options.num_layers, groups.pp), base::GroupRank(groups.pp) == 0,
                base::GroupRank(groups.pp) == base::GroupSize(groups.pp) - 1) {
  // The layers allocate and draw nothing: the draws are the one-rank model's initialisation
  // alone, the same at every layout.
  InitialiseAsOneRankModel(
      *this, first_ && last_ && base::GroupSize(groups.tp) == 1, InitLikeHf, [&] {
        return std::unique_ptr<torch::nn::Module>(new LlamaImpl(
            options, ModelGroups{}, PaddedVocabSize(options, base::GroupSize(groups.tp)),
            {0, options.num_layers}, true, true));
      });
}

LlamaImpl::LlamaImpl(const ModelOptions& options, const ModelGroups& groups,
                     int64_t padded_vocab_size, parallel::StageLayers layers, bool first, bool last)
    : LanguageModel(groups),
      options_(options),
      tp_(groups.tp),
      first_(first),
      last_(last),
      inv_freq_(InverseFrequencies(HeadDim(options), RopeOf(options))) {
  TORCH_INTERNAL_ASSERT(options.family != ModelFamily::kGpt && options.num_moe_experts == 0);
  const bool tied = !options.untie_embeddings_and_output_weights;
  auto body = register_module(kBody, std::make_shared<torch::nn::Module>());
  if (first || (last && tied)) {
    // With sequence parallelism a reduce-scatter in place of the all-reduce (Megatron's
    // reduce_scatter_embeddings, with no learned positions to add).
    embed_tokens_ = body->register_module(
        kEmbedding, parallel::VocabParallelEmbedding(padded_vocab_size, options.hidden_size,
                                                     groups.tp, sequence_parallel()));
  }
  auto stack = body->register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = layers.first; i < layers.first + layers.count; ++i) {
    layers_.push_back(stack->register_module(
        std::to_string(i), DecoderLayer(options, groups.tp, sequence_parallel())));
  }
  if (last) {
    norm_ = body->register_module("norm", RmsNorm(options.hidden_size, options.norm_epsilon));
    if (tied) {
      register_module("lm_head", TiedHead(embed_tokens_));
    } else {
      lm_head_ = register_module(
          "lm_head", parallel::ColumnParallelLinear(options.hidden_size, padded_vocab_size,
                                                    groups.tp, /*bias=*/false,
                                                    /*gather_output=*/false, sequence_parallel()));
    }
  }
}

const RotaryTables& LlamaImpl::Tables(int64_t seq, const at::Tensor& like) {
  if (!tables_ || tables_->cos.size(0) != seq || tables_->cos.device() != like.device() ||
      tables_->cos.scalar_type() != like.scalar_type()) {
    tables_ = MakeRotaryTables(inv_freq_, seq, like.options());
  }
  return *tables_;
}

at::Tensor LlamaImpl::StageForward(const at::Tensor& tokens, const at::Tensor& input,
                                   const base::PackedSequences* packed) {
  at::Tensor x = first_ ? embed_tokens_->forward(tokens) : input;
  const RotaryTables& tables = Tables(tokens.size(1), x);
  // Captured by value: a recomputed layer runs again in the backward pass.
  const RotaryTables rows = packed != nullptr ? AtPositions(tables, packed->position_ids) : tables;
  x = parallel::RunLayers(
      static_cast<int64_t>(layers_.size()), options_.recompute, is_training(),
      [layers = layers_, rows, packed](int64_t i, const at::Tensor& h) {
        return layers[i]->as<DecoderLayerImpl>()->forward(h, rows, packed);
      },
      [this](int64_t i) { return layers_[i]->parameters(); }, x);
  return x;
}

at::Tensor LlamaImpl::Logits(const at::Tensor& hidden) {
  const at::Tensor normed = norm_->forward(hidden);
  if (!lm_head_.is_empty()) return lm_head_->forward(normed);
  return parallel::ColumnParallelProduct(normed, embed_tokens_->weight(), at::Tensor(), tp_,
                                         sequence_parallel());
}

at::Tensor LlamaImpl::HeadLosses(const at::Tensor& hidden, const at::Tensor& labels) {
  // The padding rows of this rank's vocabulary slice (at the end of the last rank's) take no
  // part in the softmax.
  const int64_t rows = PaddedVocabSize(options_, base::GroupSize(tp_)) / base::GroupSize(tp_);
  const int64_t real_columns = options_.vocab_size - base::GroupRank(tp_) * rows;
  // An adapted output layer's logits are its own and its adapter's: whole, not chunked.
  if (!lm_head_.is_empty() && lm_head_->adapted()) {
    return parallel::VocabParallelCrossEntropy(
        parallel::WithoutPadding(Logits(hidden), real_columns), labels, tp_);
  }
  const at::Tensor& weight = lm_head_.is_empty() ? embed_tokens_->weight() : lm_head_->weight();
  return parallel::LinearCrossEntropy(
      parallel::ColumnParallelInput(norm_->forward(hidden), tp_, sequence_parallel()), weight,
      labels, tp_, {CrossEntropyChunkLen(options_), real_columns});
}

std::vector<std::string> LlamaImpl::LocalSequenceParallelParameters() const {
  if (!sequence_parallel() || !last_) return {};
  return {std::string(kBody) + ".norm.weight"};
}

std::vector<std::string> LlamaImpl::VocabParameters() const {
  std::vector<std::string> names;
  if (!embed_tokens_.is_empty()) names.push_back(kHfEmbeddingWeight);
  if (last_) names.push_back(kHfOutputWeight);
  return names;
}

std::optional<std::string> LlamaImpl::SharedEmbedding() const {
  if ((first_ && last_) || options_.untie_embeddings_and_output_weights) return std::nullopt;
  return kHfEmbeddingWeight;
}

}  // namespace keel::models
