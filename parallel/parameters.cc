#include "parallel/parameters.h"

#include "ATen/ATen.h"

namespace keel::parallel {
namespace {

thread_local int meta_depth = 0;

}  // namespace

at::Tensor NewParameter(at::IntArrayRef shape, double value) {
  if (meta_depth > 0) return at::empty(shape, at::TensorOptions().device(at::kMeta));
  return at::full(shape, value, at::kFloat);
}

MetaParameters::MetaParameters() { ++meta_depth; }
MetaParameters::~MetaParameters() { --meta_depth; }

}  // namespace keel::parallel
