// The index arrays of Megatron's GPT and blended datasets, 1-D or 2-D, as numpy arrays: in
// memory, or .npy files (format 1.0, as numpy.save writes them) that are created and filled
// through a writable shared mapping, or mapped read-only. A mapped array costs no heap
// memory, whatever its size: the kernel pages it in and out.
#ifndef KEEL_SAMPLING_INTERNAL_INDEX_ARRAY_H_
#define KEEL_SAMPLING_INTERNAL_INDEX_ARRAY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace keel::sampling::internal {

// numpy dtypes the indices use: "<i2", "<i4", "<u4", "<i8".
enum class IndexDtype { kInt16, kInt32, kUint32, kInt64 };

absl::string_view NpyDescr(IndexDtype dtype);

// The .npy header numpy.save writes for a C-ordered array of `dtype` and `shape`: magic,
// version 1.0, the header dict padded with spaces (room to grow the first dimension to 21
// digits) to a multiple of 64 bytes, ending with '\n'.
std::string NpyHeader(IndexDtype dtype, const std::vector<int64_t>& shape);

class IndexArray {
 public:
  // A zero-filled array in memory.
  static IndexArray InMemory(IndexDtype dtype, std::vector<int64_t> shape);
  // A new .npy file at `path` (replacing any), zero-filled and mapped writable; writes
  // through data() reach the file. Errors: base::ErrnoCode's, naming the path.
  [[nodiscard]] static absl::StatusOr<IndexArray> CreateNpy(const std::string& path,
                                                            IndexDtype dtype,
                                                            std::vector<int64_t> shape);
  // A .npy file mapped read-only (C order, little-endian, an IndexDtype, at most 2-D).
  // Errors: kNotFound for a missing file; kDataLoss naming it for anything else unexpected.
  [[nodiscard]] static absl::StatusOr<IndexArray> OpenNpy(const std::string& path);

  IndexDtype dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  // Elements in all dimensions.
  int64_t size() const;
  // Flat element `i`, widened. Requires: 0 <= i < size().
  int64_t Get(int64_t i) const;
  // The elements, for filling. Requires: T is the dtype's type; not opened read-only.
  template <typename T>
  T* data() const {
    return reinterpret_cast<T*>(data_);
  }

  // For an array from CreateNpy: flushes the mapping to the file and the file to the disk.
  // Errors: base::ErrnoCode's.
  [[nodiscard]] absl::Status Sync() const;

 private:
  IndexArray(IndexDtype dtype, std::vector<int64_t> shape, std::shared_ptr<void> storage,
             uint8_t* data, std::string path)
      : dtype_(dtype),
        shape_(std::move(shape)),
        storage_(std::move(storage)),
        data_(data),
        path_(std::move(path)) {}

  IndexDtype dtype_;
  std::vector<int64_t> shape_;
  // Owns the memory or the mapping.
  std::shared_ptr<void> storage_;
  uint8_t* data_;
  // The file of a CreateNpy array ("" otherwise).
  std::string path_;
};

}  // namespace keel::sampling::internal

#endif  // KEEL_SAMPLING_INTERNAL_INDEX_ARRAY_H_
