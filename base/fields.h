// The field-list convention for options and state structs: each struct has one
// `VisitFields(o, visitor)` overload naming its fields in declaration order, used by every
// reader and writer (JSON, configs, printing). `IsFieldsOf` selects the overload for a
// struct whether `o` is const or not.
//
//   template <typename O, typename V, keel::base::IsFieldsOf<O, MyOptions> = 0>
//   void VisitFields(O& o, V&& v) { v("rate", o.rate); v("steps", o.steps); }
#ifndef KEEL_BASE_FIELDS_H_
#define KEEL_BASE_FIELDS_H_

#include <optional>
#include <type_traits>

namespace keel::base {

template <typename O, typename T>
using IsFieldsOf = std::enable_if_t<std::is_same_v<std::remove_const_t<O>, T>, int>;

// Whether a field's type is a std::optional (a field that may be absent where it is read).
template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

}  // namespace keel::base

#endif  // KEEL_BASE_FIELDS_H_
