// Note [gradient fp8 codes] (model/autograd.h): a gradient whose writer left the FP8 codes only
// (its reader asked for codes and no values) cannot be read, accumulated into or replaced before
// the reader takes the codes; a reader that reads the values keeps them whatever the writer says.
#include <gtest/gtest.h>

#include "model/autograd.h"
#include "model/tensor.h"

namespace gtron {
namespace {

GradCodes some_codes() {
  GradCodes c;
  c.q = Tensor::zeros({2, 128}, DType::kF32);  // the contents do not matter here
  return c;
}

TEST(GradCodesDeathTest, SkippedValuesAreNotReadBeforeTheCodesAreTaken) {
  const Var v = Var::output(Tensor::zeros({2, 128}, DType::kF32), true);
  ASSERT_TRUE(v.requires_grad());
  EXPECT_FALSE(v.grad_values_unread()) << "nobody asked yet";
  v.request_grad_codes(/*values_unread=*/true);
  EXPECT_TRUE(v.grad_codes_requested());
  EXPECT_TRUE(v.grad_values_unread());
  bool overwrite = false;
  v.grad_for_write(&overwrite);
  EXPECT_TRUE(overwrite);
  v.set_grad_codes(some_codes(), /*values_skipped=*/true);
  EXPECT_DEATH(v.grad(), "skipped");
  bool again = false;
  EXPECT_DEATH(v.grad_for_write(&again), "skipped");
  EXPECT_DEATH(v.set_grad(Tensor::zeros({2, 128}, DType::kF32)), "skipped");
  EXPECT_TRUE(v.take_grad_codes().defined());
  v.grad();  // taken: the reader may touch the slot (it reads no values)
  EXPECT_FALSE(v.take_grad_codes().defined());
}

TEST(GradCodes, AReaderOfTheValuesKeepsThemAndAnyAccessDropsTheCodes) {
  const Var v = Var::output(Tensor::zeros({2, 128}, DType::kF32), true);
  v.request_grad_codes(/*values_unread=*/false);
  EXPECT_FALSE(v.grad_values_unread());
  bool overwrite = false;
  v.grad_for_write(&overwrite);
  v.set_grad_codes(some_codes(), /*values_skipped=*/true);  // ignored: the values are read
  v.grad();  // a second writer: fine, and the codes no longer stand for the gradient
  EXPECT_FALSE(v.take_grad_codes().defined());
}

}  // namespace
}  // namespace gtron
