// Propagation macros for absl::Status / absl::StatusOr, which Debian's Abseil 20220623 lacks,
// and Annotate, which adds context to an error on its way up without changing its code.
//
//   absl::StatusOr<Config> Load(const std::string& path) {
//     KEEL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
//     KEEL_RETURN_IF_ERROR(keel::base::Annotate(Validate(text), path));  // "<path>: <error>"
//     return Parse(text);
//   }
#ifndef KEEL_BASE_STATUS_H_
#define KEEL_BASE_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace keel::base {

// `status` with "<context>: " before its message and the same code; OK stays OK.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace keel::base

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define KEEL_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status keel_status_ = (expr);        \
    if (!keel_status_.ok()) return keel_status_; \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status if not OK, else moves the
// value into `lhs` (a declaration such as `auto x` or an existing variable).
#define KEEL_ASSIGN_OR_RETURN(lhs, rexpr) \
  KEEL_ASSIGN_OR_RETURN_IMPL_(KEEL_STATUS_CONCAT_(keel_statusor_, __LINE__), lhs, rexpr)

#define KEEL_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)  \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#define KEEL_STATUS_CONCAT_(a, b) KEEL_STATUS_CONCAT_INNER_(a, b)
#define KEEL_STATUS_CONCAT_INNER_(a, b) a##b

#endif  // KEEL_BASE_STATUS_H_
