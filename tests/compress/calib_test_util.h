#pragma once
// A test fixture on stories260K with its calibration statistics (Hessians included) over the
// first NTokens tokens of tinystories_val.txt, computed once per suite; its tests are skipped
// where ../shared lacks the model or the text.
#include <gtest/gtest.h>

#include <filesystem>

#include "compress/calibrate.h"
#include "compress_test_util.h"
#include "models/model.h"

namespace tern::testing {

template <int NTokens>
class StoriesCalibrated : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(stories()) || !std::filesystem::exists(tinystories_val())) return;
    CalibOptions co;
    co.text_file = tinystories_val();
    co.n_tokens = NTokens;
    co.hessian = true;
    calib_ = new CalibStats(calibrate(open_model_file(stories()), co));
  }
  static void TearDownTestSuite() {
    delete calib_;
    calib_ = nullptr;
  }
  void SetUp() override {
    TERN_REQUIRE_SHARED("models/stories260K.gguf");
    TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  }
  static inline CalibStats* calib_ = nullptr;
};

}  // namespace tern::testing
