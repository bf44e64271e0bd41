// Python's json.dumps(obj, indent=4) for a base::Json value, byte for byte: the text of the
// descriptions whose MD5 names Megatron's index cache files. Keys keep their order; strings
// are escaped as ensure_ascii does (non-ASCII as \uXXXX, surrogate pairs beyond U+FFFF, bytes
// that are not UTF-8 as the \udcXX of Python's surrogateescape); floats are written as
// Python's repr (the shortest digits that read back exactly; exponent form below 1e-4 and
// from 1e16 on; "NaN", "Infinity", "-Infinity") and integers as integers.
#ifndef KEEL_SAMPLING_INTERNAL_PYTHON_JSON_H_
#define KEEL_SAMPLING_INTERNAL_PYTHON_JSON_H_

#include <string>

#include "base/json.h"

namespace keel::sampling::internal {

std::string PythonJsonDumps(const base::Json& value);

// repr(x) of a Python float.
std::string PythonFloatRepr(double x);

}  // namespace keel::sampling::internal

#endif  // KEEL_SAMPLING_INTERNAL_PYTHON_JSON_H_
