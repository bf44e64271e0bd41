// MD5 (RFC 1321), for the names of Megatron's index cache files, which are the hex digest of
// a dataset's description (hashlib.md5(...).hexdigest()). Not for security.
#ifndef KEEL_SAMPLING_INTERNAL_MD5_H_
#define KEEL_SAMPLING_INTERNAL_MD5_H_

#include <string>

#include "absl/strings/string_view.h"

namespace keel::sampling::internal {

// The 32 lowercase hex digits of the MD5 digest of `data`.
std::string Md5Hex(absl::string_view data);

}  // namespace keel::sampling::internal

#endif  // KEEL_SAMPLING_INTERNAL_MD5_H_
