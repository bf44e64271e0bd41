// The bridge from LibTorch's exceptions to absl::Status: Keel code does not throw, so every
// LibTorch call that can fail because of data, files or peers goes through CallTorch.
//
//   KEEL_RETURN_IF_ERROR(keel::base::CallTorch(absl::StatusCode::kUnavailable, "allreduce",
//                                              [&] { group.allreduce(tensors)->wait(); }));
#ifndef KEEL_BASE_TORCH_STATUS_H_
#define KEEL_BASE_TORCH_STATUS_H_

#include <exception>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "c10/util/Exception.h"

namespace keel::base {

// Runs `fn`; a c10::Error (or other std::exception) it throws becomes a Status with `code`
// and the message "<context>: <what LibTorch said, without backtrace>".
template <typename Fn>
[[nodiscard]] absl::Status CallTorch(absl::StatusCode code, absl::string_view context, Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& error) {
    return absl::Status(code, absl::StrCat(context, ": ", error.what_without_backtrace()));
  } catch (const std::exception& error) {
    return absl::Status(code, absl::StrCat(context, ": ", error.what()));
  }
  return absl::OkStatus();
}

}  // namespace keel::base

#endif  // KEEL_BASE_TORCH_STATUS_H_
