// Core: error message form, dtype names and sizes, bf16 conversion, tensor views, device queries.
#include <gtest/gtest.h>

#include <cmath>

#include "moekit/device.h"
#include "moekit/dtype.h"
#include "moekit/error.h"
#include "moekit/presets.h"
#include "moekit/tensor.h"

namespace moekit {
namespace {

TEST(Error, MessageNamesTheOp) {
  InvalidArgument e("route", "top_k (9) must be <= num_experts (8)");
  EXPECT_STREQ(e.what(), "moekit::route: top_k (9) must be <= num_experts (8)");
  EXPECT_EQ(e.op(), "route");
  const Error& base = e;
  EXPECT_NE(dynamic_cast<const InvalidArgument*>(&base), nullptr);
}

TEST(DType, SizesAndNamesRoundTrip) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f8e4m3, DType::i32, DType::i16, DType::i8, DType::u8})
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(dtype_size(DType::f32), 4);
  EXPECT_EQ(dtype_size(DType::bf16), 2);
  EXPECT_EQ(dtype_size(DType::i16), 2);
  EXPECT_EQ(dtype_size(DType::f8e4m3), 1);
  try {
    parse_dtype("float64");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "moekit::dtype: unknown dtype 'float64' (expected one of: fp32, bf16, fp16, fp8_e4m3, "
                 "int32, int16, int8, uint8)");
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half-way between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3*2^-8 is half-way between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(bf16_to_float(0xc040), -3.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(INFINITY))));
}

// Values exact in bf16, so the expected errors are worked by hand: got = want + (0, 0, 1) with want = (1, 2, 2)
// gives ||d|| / ||want|| = 1 / 3.
TEST(DType, RelativeFrobeniusBf16) {
  const uint16_t want[3] = {float_to_bf16(1.0f), float_to_bf16(2.0f), float_to_bf16(2.0f)};
  const uint16_t got[3] = {float_to_bf16(1.0f), float_to_bf16(2.0f), float_to_bf16(3.0f)};
  EXPECT_DOUBLE_EQ(relative_frobenius_bf16(got, want, 3), 1.0 / 3.0);
  EXPECT_EQ(relative_frobenius_bf16(want, want, 3), 0.0);
  const uint16_t zero[3] = {0, 0, 0};
  EXPECT_DOUBLE_EQ(relative_frobenius_bf16(got, zero, 3), std::sqrt(14.0));  // absolute norm when want is zero
  const uint16_t nan[3] = {float_to_bf16(1.0f), float_to_bf16(std::nanf("")), float_to_bf16(2.0f)};
  EXPECT_TRUE(std::isnan(relative_frobenius_bf16(nan, want, 3)));
}

TEST(TensorView, ContiguousShapeAndStrides) {
  float buf[24];
  TensorView v = TensorView::contiguous(buf, DType::f32, {2, 3, 4});
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_TRUE(v.present());
  EXPECT_EQ(v.describe(), "[2, 3, 4] fp32 cpu");
  v.strides[0] = 16;
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_FALSE(TensorView{}.present());
  EXPECT_THROW(TensorView::contiguous(buf, DType::f32, {1, 2, 3, 4, 5}), InvalidArgument);
  EXPECT_THROW(TensorView::contiguous(buf, DType::f32, {-1}), InvalidArgument);
  try {
    TensorView::contiguous(buf, DType::f32, {int64_t{1} << 32, int64_t{1} << 31, 2});  // 2^64 elements
    ADD_FAILURE() << "no exception for a shape whose element count overflows int64";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "moekit::tensor: shape [4294967296, 2147483648, 2] fp32 cpu must hold at most 2^63 - 1 "
                 "elements");
  }
}

TEST(TensorView, StartsAlignedLooksAtTheDataAddress) {
  alignas(16) unsigned char buf[64] = {};
  const TensorView at16 = TensorView::contiguous(buf, DType::f32, {4});
  EXPECT_TRUE(at16.starts_aligned(16));
  EXPECT_TRUE(at16.starts_aligned(4));
  const TensorView at2 = TensorView::contiguous(buf + 2, DType::bf16, {4});
  EXPECT_TRUE(at2.starts_aligned(2));
  EXPECT_FALSE(at2.starts_aligned(4));
  EXPECT_FALSE(TensorView::contiguous(buf + 4, DType::f32, {4}).starts_aligned(16));
  EXPECT_FALSE(TensorView::contiguous(buf + 1, DType::i16, {4}).starts_aligned(2));
}

TEST(TensorView, OverlapsComparesTheBytesTheElementsSpan) {
  float buf[32];
  const TensorView a = TensorView::contiguous(buf, DType::f32, {2, 4});  // bytes [0, 32)
  EXPECT_TRUE(a.overlaps(a));
  EXPECT_TRUE(a.overlaps(TensorView::contiguous(buf + 7, DType::f32, {3})));   // shares element 7
  EXPECT_FALSE(a.overlaps(TensorView::contiguous(buf + 8, DType::f32, {3})));  // starts where a ends
  EXPECT_TRUE(TensorView::contiguous(buf + 8, DType::f32, {3})
                  .overlaps(TensorView::contiguous(buf, DType::bf16, {17})));  // 34 bytes
  EXPECT_FALSE(
      TensorView::contiguous(buf + 8, DType::f32, {3}).overlaps(TensorView::contiguous(buf, DType::bf16, {16})));
  // Strided: the span runs from the lowest element to the highest, gaps included.
  TensorView cols = TensorView::contiguous(buf, DType::f32, {4, 2});
  cols.strides = {8, 1};  // rows 8 floats apart: elements 0..25
  EXPECT_TRUE(cols.overlaps(TensorView::contiguous(buf + 25, DType::f32, {1})));
  EXPECT_FALSE(cols.overlaps(TensorView::contiguous(buf + 26, DType::f32, {6})));
  TensorView reversed = TensorView::contiguous(buf + 20, DType::f32, {4});
  reversed.strides = {-4};  // elements 20, 16, 12, 8
  EXPECT_TRUE(reversed.overlaps(TensorView::contiguous(buf + 8, DType::f32, {1})));
  EXPECT_FALSE(reversed.overlaps(TensorView::contiguous(buf, DType::f32, {8})));
  EXPECT_FALSE(reversed.overlaps(TensorView::contiguous(buf + 21, DType::f32, {4})));
  // Other devices, absent views, no elements, no data.
  EXPECT_FALSE(a.overlaps(TensorView::contiguous(buf, DType::f32, {2, 4}, Device::cuda(0))));
  EXPECT_FALSE(a.overlaps(TensorView{}));
  EXPECT_FALSE(a.overlaps(TensorView::contiguous(buf, DType::f32, {0, 4})));
  EXPECT_FALSE(TensorView::contiguous(nullptr, DType::f32, {2, 4}).overlaps(a));
}

TEST(Device, QueriesNeverThrowWithoutAGpu) {
  int n = cuda_device_count();
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_FALSE(device_is_sm90(0));
    EXPECT_THROW(device_info(0), NotSupported);
    // The memory helpers fail with moekit's errors (NotSupported without CUDA, CudaError without a device).
    int x = 0, y = 0;
    EXPECT_THROW(copy_to_device(&x, &y, 4), Error);
    EXPECT_THROW(copy_to_host(&x, &y, 4), Error);
    EXPECT_THROW(fill_device_bytes(&x, 0, 4), Error);
  } else {
    EXPECT_FALSE(device_info(0).name.empty());
  }
  EXPECT_EQ(device_name(Device::cuda(1)), "cuda:1");
}

TEST(Presets, EveryPresetValidates) {
  for (const Preset& p : presets()) {
    SCOPED_TRACE(std::string(p.name));
    EXPECT_NO_THROW(p.routing.validate());
    EXPECT_EQ(p.routing.num_experts, p.experts.num_experts);
    EXPECT_EQ(p.routing.top_k, p.experts.top_k);
    EXPECT_EQ(p.routing.num_shared_experts, p.experts.num_shared_experts);
    EXPECT_EQ(&find_preset(p.name), &p);
    // Llama-4 scales the expert's input by the routing weight; every other preset its output.
    EXPECT_EQ(p.experts.routing_weight_on_input, p.routing.method == RoutingMethod::llama4);
  }
  EXPECT_THROW(find_preset("gpt-5"), InvalidArgument);
}

}  // namespace
}  // namespace moekit
