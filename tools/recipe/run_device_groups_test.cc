// The trainer's step on a GPU's terms, on machines without one: each rank trains on its fake GPU
// (testing::FakeGpu) over a mesh whose device groups refuse host tensors as NCCL does
// (testing::NcclLikeGroup), with Gloo twins for host values, as a DeviceMesh of backend nccl has.
// For data, tensor, pipeline and expert parallelism and the distributed optimizer, two steps
// run without a host tensor reaching a device group, and their losses and gradient norms are
// those of the same ranks on the CPU over Gloo. Ranks are processes: the model's initialization
// draws from the default generator, which threads would share.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/Parallel.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/device_mesh.h"
#include "parallel/mesh_layout.h"
#include "parallel/process_group.h"
#include "testing/fake_gpu.h"
#include "testing/files.h"
#include "testing/nccl_like_group.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "tools/recipe/corpus_testutil.h"
#include "tools/recipe/run.h"
#include "tools/recipe/runtime.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::Rank;

constexpr int kWorld = 2;

// Two layers of width 32 over 16-token windows, 4 samples a step in micro-batches of 1; clipped
// and its norm checked each step.
TrainOptions Options() {
  TrainOptions options;
  options.seed = 7;
  options.step_scheduler.global_batch_size = 4;
  options.step_scheduler.max_steps = 2;
  options.step_scheduler.ckpt_every_steps = 1000;
  options.step_scheduler.val_every_steps = 1000;
  options.step_scheduler.preemption_signal = std::nullopt;
  options.local_batch_size = 1;
  options.data.prefix = PangramCorpus();
  options.data.dataset.sequence_length = 16;
  options.data.validation_every_n_samples = 10;
  options.sampler.micro_batch_size = 1;
  options.sampler.global_batch_size = 4;
  options.sampler.dataloader_type = sampling::DataloaderType::kSingle;
  options.model.hidden_size = 32;
  options.model.num_layers = 2;
  options.model.num_attention_heads = 2;
  options.model.ffn_hidden_size = 64;
  options.model.max_sequence_length = 16;
  options.lr_scheduler.max_lr = 1e-3;
  options.lr_scheduler.lr_decay_steps = 100;
  options.max_norm = 1.0;
  options.check_norm_every_steps = 1;  // every rank's gradient blocks, over the Gloo twins
  options.logging.tensorboard = false;
  return options;
}

// Each step's loss and gradient norm.
struct Trace {
  std::vector<double> losses, grad_norms;
};

// Two steps of `options` on this rank: its micro-batches of samples (4 a step, split over the
// data-parallel ranks), on `device`, with the groups of `mesh`.
absl::StatusOr<Trace> TrainTwoSteps(const TrainOptions& options, const parallel::DeviceMesh& mesh,
                                    const at::Device& device) {
  std::ostringstream log;
  TrainRuntime runtime;
  runtime.log = &log;
  AttachMesh(mesh, device, runtime);
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<Run> run, Run::Build(options, std::move(runtime)));
  Trace trace;
  const int64_t per_rank = 4 / mesh.GroupSize(parallel::GroupKind::kDp);
  const int64_t first = mesh.GroupRank(parallel::GroupKind::kDp) * per_rank;
  for (int64_t step = 0; step < 2; ++step) {
    std::vector<std::vector<int64_t>> micro_batches;
    for (int64_t k = 0; k < per_rank; ++k) micro_batches.push_back({step * 4 + first + k});
    KEEL_ASSIGN_OR_RETURN(StepOutput output, run->Step(micro_batches));
    trace.losses.push_back(output.loss);
    trace.grad_norms.push_back(output.grad_norm);
  }
  return trace;
}

// A mesh of `options`' layout through `store`: Gloo's, or one whose device groups are
// NcclLikeGroups.
absl::StatusOr<parallel::DeviceMesh> Mesh(const TrainOptions& options, const Rank& r,
                                          const std::string& prefix, bool nccl_like) {
  KEEL_ASSIGN_OR_RETURN(parallel::MeshLayout layout,
                        parallel::MeshLayout::Create(options.distributed.parallel, kWorld));
  const auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, r.store);
  const std::chrono::seconds timeout(30);
  if (!nccl_like) {
    return parallel::DeviceMesh::Create(std::move(layout), r.rank, store, parallel::Backend::kGloo,
                                        timeout);
  }
  return parallel::DeviceMesh::CreateWithDeviceGroups(
      std::move(layout), r.rank, store,
      [](const c10::intrusive_ptr<c10d::Store>& group_store, int rank, int size,
         std::chrono::milliseconds group_timeout)
          -> absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> {
        KEEL_ASSIGN_OR_RETURN(
            auto gloo, parallel::CreateProcessGroup(parallel::Backend::kGloo, group_store, rank,
                                                    size, group_timeout));
        return c10::intrusive_ptr<c10d::ProcessGroup>(
            c10::make_intrusive<keel::testing::NcclLikeGroup>(gloo));
      },
      timeout);
}

// `device` within 1e-5 of `host`: the fake GPU runs the CPU's kernels, or LibTorch's generic
// ones (layer norm's), which round otherwise.
absl::Status ExpectClose(const std::string& what, const std::vector<double>& device,
                         const std::vector<double>& host) {
  for (size_t i = 0; i < host.size(); ++i) {
    if (!(std::abs(device[i] - host[i]) <= 1e-5 * std::abs(host[i]))) {
      return absl::InternalError(absl::StrCat(what, " of step ", i + 1, ": ", device[i],
                                              " on the fake GPU, ", host[i], " on the CPU"));
    }
  }
  return absl::OkStatus();
}

void ExpectSameStepsOnDeviceGroups(const std::string& name, const TrainOptions& options) {
  PangramCorpus();
  at::set_num_threads(1);  // no OpenMP team in the parent: the ranks fork cleanly
  const std::string dir = keel::testing::NewTempDir(name);
  const std::vector<absl::Status> statuses =
      keel::testing::RunOnRankProcesses(kWorld, [&](Rank& r) -> absl::Status {
        TrainOptions host_options = options, device_options = options;
        host_options.run_dir = dir + "/host";
        host_options.checkpoint.checkpoint_dir = dir + "/host/checkpoints";
        device_options.run_dir = dir + "/device";
        device_options.checkpoint.checkpoint_dir = dir + "/device/checkpoints";
        KEEL_ASSIGN_OR_RETURN(parallel::DeviceMesh gloo, Mesh(host_options, r, "gloo", false));
        KEEL_ASSIGN_OR_RETURN(Trace host, TrainTwoSteps(host_options, gloo, at::kCPU));
        KEEL_ASSIGN_OR_RETURN(parallel::DeviceMesh nccl_like,
                              Mesh(device_options, r, "nccl_like", true));
        KEEL_ASSIGN_OR_RETURN(
            Trace device,
            TrainTwoSteps(device_options, nccl_like,
                          keel::testing::FakeGpu(static_cast<c10::DeviceIndex>(r.rank))));
        KEEL_RETURN_IF_ERROR(ExpectClose("the loss", device.losses, host.losses));
        return ExpectClose("the gradient norm", device.grad_norms, host.grad_norms);
      });
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_TRUE(statuses[rank].ok()) << name << ", rank " << rank << ": " << statuses[rank];
  }
}

TEST(RunOnDeviceGroupsTest, DataParallel) { ExpectSameStepsOnDeviceGroups("dp2", Options()); }

TEST(RunOnDeviceGroupsTest, DistributedOptimizer) {
  TrainOptions options = Options();
  options.distributed.use_distributed_optimizer = true;
  ExpectSameStepsOnDeviceGroups("dp2_zero", options);
}

TEST(RunOnDeviceGroupsTest, TensorParallel) {
  TrainOptions options = Options();
  options.distributed.parallel.tensor_model_parallel_size = 2;
  ExpectSameStepsOnDeviceGroups("tp2", options);
}

TEST(RunOnDeviceGroupsTest, PipelineParallel) {
  TrainOptions options = Options();
  options.distributed.parallel.pipeline_model_parallel_size = 2;
  ExpectSameStepsOnDeviceGroups("pp2", options);
}

TEST(RunOnDeviceGroupsTest, ExpertParallel) {
  TrainOptions options = Options();
  options.model.num_moe_experts = 2;
  options.model.moe_router_topk = 1;
  options.model.moe_aux_loss_coeff = 1e-2;
  options.distributed.parallel.expert_model_parallel_size = 2;
  ExpectSameStepsOnDeviceGroups("ep2", options);
}

}  // namespace
}  // namespace keel::tools::recipe
