// A training blend whose consumption checkpoints record, so that a resume with other blend
// weights (or datasets, or size) continues every dataset where it stopped: no sample of a
// dataset is served twice or skipped within its epochs. A Keel addition: Megatron-LM rebuilds
// the blend, and its datasets' sample orders, from the new configuration (Megatron-LM #457).
//
// Each dataset serves a stream of samples: first the GPT dataset Megatron builds for it
// (generation 0); when a resume needs more samples than the stream holds, another GPT
// dataset over the same documents, seeded random_seed + g, follows (generation g). A
// generation holds whole epochs of the documents and is used up before the next begins, so
// every document is served once per epoch. Positions of the blend go to datasets as
// Megatron's build_blending_indices sends them: unchanged weights continue that greedy
// exactly; new weights start it afresh at the resume position.
//
//   KEEL_ASSIGN_OR_RETURN(auto blend, ResumableBlend::Fresh(train_view));
//   BlendState state = blend->State(consumed_samples);  // into the checkpoint
//   // later, after a resume with other weights:
//   KEEL_ASSIGN_OR_RETURN(blend, ResumableBlend::Continue(state, new_train_view, config, mode));
#ifndef KEEL_SAMPLING_RESUMABLE_BLEND_H_
#define KEEL_SAMPLING_RESUMABLE_BLEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/fields.h"
#include "sampling/gpt_dataset_builder.h"

namespace keel::sampling {

// What a checkpoint holds of a training blend.
struct BlendState {
  // Positions of the blend consumed (the sampler's consumed_samples).
  int64_t consumed_samples = 0;
  std::vector<std::string> dataset_paths;
  // The normalized weights the greedy follows from segment_start on.
  std::vector<double> weights;
  // Per dataset: samples of its stream served before consumed_samples.
  std::vector<int64_t> dataset_consumed;
  // Per dataset: the num_samples of each generation of its stream.
  std::vector<std::vector<int64_t>> generations;
  // The position from which the weights apply, and each dataset's samples served before it.
  int64_t segment_start = 0;
  std::vector<int64_t> segment_base;
  // The seed of generation 0 (generation g: random_seed + g) and the split string.
  int64_t random_seed = 0;
  std::string split;
};

template <typename O, typename V, base::IsFieldsOf<O, BlendState> = 0>
void VisitFields(O& o, V&& v) {
  v("consumed_samples", o.consumed_samples);
  v("dataset_paths", o.dataset_paths);
  v("weights", o.weights);
  v("dataset_consumed", o.dataset_consumed);
  v("generations", o.generations);
  v("segment_start", o.segment_start);
  v("segment_base", o.segment_base);
  v("random_seed", o.random_seed);
  v("split", o.split);
}

// Where a position of the blend comes from.
struct BlendSample {
  // The dataset among the blend's, and its sample in that dataset's stream.
  int64_t dataset = 0;
  int64_t stream_sample = 0;
  // The GPT dataset (a generation) holding it, and the sample there.
  const MegatronGptDataset* gpt = nullptr;
  int64_t sample = 0;
};

class ResumableBlend {
 public:
  // Megatron's training split of a fresh run (a GPTDataset or a sized BlendedDataset).
  // Errors: kInvalidArgument for anything else.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ResumableBlend>> Fresh(
      const GptSplitView& train, const GptDatasetConfig& config);

  // Continues `saved` at saved.consumed_samples over the datasets and weights of `fresh`
  // (this run's Megatron split, whose size it keeps): datasets are matched by path, a new one
  // starts at its first sample, and generations are added where the rest of the run needs
  // more samples (built with `mode`). Identical to `fresh` when nothing changed. `notes`
  // receives one line per change. Errors: kInvalidArgument for a saved state that does not
  // hold one entry per dataset or a position past the split; as MegatronGptDataset::Create.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ResumableBlend>> Continue(
      const BlendState& saved, const GptSplitView& fresh, const GptDatasetConfig& config,
      IndexCacheMode mode, std::vector<std::string>* notes);

  int64_t size() const { return size_; }
  const std::vector<std::string>& dataset_paths() const { return paths_; }
  const std::vector<double>& weights() const { return weights_; }

  // Position `position` of the blend. Not thread-safe (a cursor makes in-order reads O(1)).
  // Errors: kOutOfRange outside [resume position, size()); kInternal past a stream's end.
  [[nodiscard]] absl::StatusOr<BlendSample> Locate(int64_t position);

  // The state after `consumed_samples` positions. Errors: kOutOfRange outside
  // [resume position, size()].
  [[nodiscard]] absl::StatusOr<BlendState> State(int64_t consumed_samples);

 private:
  ResumableBlend() = default;
  // Moves the cursor to `position`, tallying each dataset's positions. Errors: Megatron's
  // blend's Locate.
  [[nodiscard]] absl::Status Seek(int64_t position);
  // The dataset the greedy sends the cursor's position to.
  int64_t NextDataset() const;
  // Each dataset's index in `saved` (-1 for a new one, or all when the split changed).
  std::vector<int64_t> Match(const BlendState& saved, std::vector<std::string>* notes) const;
  // Whether `saved` is this very blend at `consumed` (nothing changed).
  bool IsPlainResumeOf(const BlendState& saved, const std::vector<int64_t>& match,
                       int64_t consumed);
  // Positions from `consumed` on: the saved greedy if nothing but the sizes changed, else a
  // new one at the current weights.
  void StartSegment(const BlendState& saved, const std::vector<int64_t>& match, int64_t consumed,
                    std::vector<std::string>* notes);
  // The saved generations of each dataset that continues.
  absl::Status RebuildStreams(const BlendState& saved, const std::vector<int64_t>& match,
                              const GptDatasetConfig& config, IndexCacheMode mode);
  // Adds a generation where the rest of the split may need more samples than a stream holds.
  absl::Status ExtendStreams(const GptDatasetConfig& config, IndexCacheMode mode,
                             std::vector<std::string>* notes);
  // Generation g over the documents of `base`: num_samples, seeded random_seed + g.
  absl::StatusOr<std::shared_ptr<const MegatronGptDataset>> Generation(
      const MegatronGptDataset& base, int64_t num_samples, int64_t g,
      const GptDatasetConfig& config, IndexCacheMode mode) const;

  GptSplitView megatron_;  // positions of a fresh run: Megatron's own indices
  bool continued_ = false;
  int64_t size_ = 0;
  std::vector<std::string> paths_;
  std::vector<double> weights_;
  std::vector<std::vector<std::shared_ptr<const MegatronGptDataset>>> streams_;
  int64_t random_seed_ = 0;
  std::string split_;
  int64_t segment_start_ = 0;
  std::vector<int64_t> segment_base_;
  // Where reads may start, and each dataset's positions in [segment_start, origin).
  int64_t origin_ = 0;
  std::vector<int64_t> origin_taken_;
  // The cursor: a position and each dataset's positions in [segment_start, position)
  // (a fresh run: in [0, position)).
  int64_t cursor_ = 0;
  std::vector<int64_t> taken_;
};

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_RESUMABLE_BLEND_H_
