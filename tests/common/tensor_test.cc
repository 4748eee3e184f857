#include <gtest/gtest.h>

#include "common/common.h"

namespace flotilla {
namespace {

TEST(TensorTest, ParsesDatatypeNames) {
  EXPECT_EQ(parse_datatype("FP32"), DataType::kFp32);
  EXPECT_EQ(parse_datatype("BOOL"), DataType::kBool);
  EXPECT_FALSE(parse_datatype("FP33").has_value());
  EXPECT_FALSE(parse_datatype("fp32").has_value());  // names are case-sensitive
  EXPECT_EQ(datatype_name(DataType::kInt64), "INT64");
  EXPECT_EQ(element_size(DataType::kFp64), 8u);
}

TEST(TensorTest, SlicesRowsOfAMatrix) {
  Tensor tensor{"t", DataType::kInt32, {3, 2}, {}};
  for (int32_t v = 0; v < 6; ++v) {
    tensor.append(v);
  }
  Tensor middle = tensor.slice_rows(1, 2);
  EXPECT_EQ(middle.shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(middle.values<int32_t>()[0], 2);
  EXPECT_EQ(middle.values<int32_t>()[1], 3);
  EXPECT_EQ(tensor.element_count(), 6);
}

TEST(TensorTest, ConvertsElementsToDouble) {
  Tensor flags{"b", DataType::kBool, {2}, {1, 0}};
  EXPECT_EQ(flags.element_as_double(0), 1.0);
  EXPECT_EQ(flags.element_as_double(1), 0.0);
  Tensor floats{"f", DataType::kFp32, {1}, {}};
  floats.append(2.5f);
  EXPECT_EQ(floats.element_as_double(0), 2.5);
}

}  // namespace
}  // namespace flotilla
